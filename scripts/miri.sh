#!/usr/bin/env bash
# Runs the tests that Miri can interpret, to catch undefined behaviour in barewire's unsafe
# code: the task cells and their list (engine), the key tables (rdma-types), the stream's
# placement and gather lists (soft-rdma), and the drivers' buffers and shared-memory message
# ring. Manual, like the fuzz targets: it needs the nightly toolchain with its `miri` and
# `rust-src` components, and takes about 25 minutes here.
#
#   rustup +nightly component add miri rust-src
#   bash scripts/miri.sh
#
# Miri runs no io_uring, so the engine runs on its epoll reactor with no fixed-file table.
# Left out: tests that judge elapsed time against deadlines of milliseconds to seconds (Miri
# runs code about a thousand times slower, so they fail for that alone); a test that needs one
# waker recognised as another's (Miri gives vtables no fixed address, so `Waker::will_wake`
# says no); loops of millions of messages, the long random scripts and the corpus replays
# (hours under Miri), and the CRC's sweeps over every length against the bitwise reference
# (the folding path itself still runs); and anything that opens a socket (Miri has no sockets)
# or maps a memfd (the shm ring's own tests put it in ordinary memory under Miri).
set -euo pipefail
cd "$(dirname "$0")/.."

export CARGO_TARGET_DIR=target/miri
export MIRIFLAGS="-Zmiri-disable-isolation -Zmiri-permissive-provenance -Zmiri-num-cpus=2"
export BAREWIRE_REACTOR=epoll BAREWIRE_FIXED_FILES=0

echo "== rdma-types: key tables, completion queues, queue-pair states"
cargo +nightly miri test -p barewire-rdma-types --lib

echo "== engine: tasks (spawn, join, cancel, wake across cores, shutdown), the task cache, timers"
cargo +nightly miri test -p barewire-engine --lib -- core::tests spsc::tests task::cache::tests \
  --skip the_main_futures_yields_are_a_flag
cargo +nightly miri test -p barewire-engine --test runtime -- \
  --skip pinned_cores --skip dropping_a_handle_detaches_the_task --skip a_wake_from_another_thread \
  --skip local_channels_and_semaphore_work_together --skip shutdown_drops_pending_tasks_on_their_core
cargo +nightly miri test -p barewire-engine --test task_cache -- \
  --skip gives_back_cells_unused_for_the_keep_interval
cargo +nightly miri test -p barewire-engine --test time -- \
  timeout_fires_and_drops_the_inner_future a_dropped_sleep_is_removed
cargo +nightly miri test -p barewire-engine --test poller -- each_yield_lets_every_poller_run \
  an_idle_core_looks_at_memory_between_passes a_core_watching_no_memory_makes_no_looks
cargo +nightly miri test -p barewire-engine --lib -- net::addr::tests

echo "== soft-rdma: the sans-I/O stream (placement, gather lists, Terminates) and the wire codec"
# (`stream::fuzz::tests` put guard pages around their regions with mmap, which Miri lacks.)
cargo +nightly miri test -p barewire-soft-rdma --lib --test stream -- \
  --skip random_scripts_keep_every_promise --skip corpus --skip stream::fuzz::tests \
  --skip every_length_matches_the_reference --skip any_bytes_cut_anywhere

echo "== drivers: buffers (bounds, the inline copies), the shm ring against a hostile writer and reader"
# (An explicit soft or shm transport never asks libibverbs for its devices, so these run. The
# shm_ring fuzz seeds also pass under Miri, `--test fuzz_corpus -- the_seeds_pass`, but take
# about 13 minutes, so they are left out here.)
cargo +nightly miri test -p barewire-drivers --lib -- ops::tests shm::ring transport::tests
