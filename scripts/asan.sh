#!/usr/bin/env bash
# Runs the test suites under AddressSanitizer and LeakSanitizer, to catch what Miri cannot reach
# (scripts/miri.sh): the unsafe code that only runs against the kernel. That is the io_uring
# operations and the buffers they park, the registered pool, the provided-buffer rings, the soft
# provider on real sockets under both reactors and SQPOLL, the shm backend's memfd mappings and
# rings, the facade's channels, DSM, actors and cluster across processes, and the soak's fault
# paths (peers killed and stopped). It fails on any report: an access out of bounds or after
# free, a double free, or memory still allocated and unreachable when a process exits (a leak).
#
# Manual, like the fuzz targets: it needs the nightly toolchain, and no component beyond it (its
# standard library ships the sanitizer runtime). It takes about 15 minutes here, its build
# included.
#
#   bash scripts/asan.sh
#
# The kernel's own writes into user memory (a completed receive) are not checked, since
# AddressSanitizer sees only what the process does itself. Nor is memory mapped outside the
# allocator, such as the shm backend's regions. Doctests are left out (rustdoc would build each
# example again with the sanitizer). So are two tests that judge this build's speed rather than
# its memory:
# - engine `stress::ping_pong_against_sleeping_cores_loses_no_wakeup` counts the cores' sleeps
#   between turns of 20 µs. With the sanitizer's checks, a core often has not finished going to
#   sleep before its turn comes (24,262 sleeps in 100,000 turns here, against about 99,000
#   without), and the count's bound fails.
# - soft-rdma `listener::a_flood_of_ten_thousand_connections_leaves_memory_bounded...` bounds
#   the process's resident memory, which the sanitizer's shadow memory and quarantine inflate.
# A test that allocates beyond the machine's memory on purpose (drivers `shm`) needs the
# allocator to say no rather than abort: `allocator_may_return_null`.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! cargo +nightly --version > /dev/null 2>&1; then
    echo "scripts/asan.sh needs the nightly toolchain: rustup toolchain install nightly" >&2
    exit 1
fi

# --target keeps build scripts and proc macros out of the instrumented build.
TARGET="$(rustc -vV | sed -n 's/^host: //p')"
export CARGO_TARGET_DIR=target/asan
export RUSTFLAGS="-Zsanitizer=address"
# Child processes (the multi-process tests' peers) inherit these.
export ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=1"
test_asan() {
    cargo +nightly test --target "$TARGET" "$@"
}

cargo +nightly build --target "$TARGET" --workspace --examples

for reactor in io_uring epoll; do
    echo "== engine, rdma-types, soft-rdma, drivers ($reactor reactor)"
    BAREWIRE_REACTOR=$reactor test_asan -p barewire-engine -p barewire-rdma-types \
        -p barewire-soft-rdma -p barewire-drivers --lib --tests -- \
        --skip ping_pong_against_sleeping_cores_loses_no_wakeup \
        --skip a_flood_of_ten_thousand_connections_leaves_memory_bounded
done

echo "== soft-rdma under SQPOLL"
BAREWIRE_REACTOR=io_uring BAREWIRE_SQPOLL=on test_asan -p barewire-soft-rdma --lib \
    --test provider --test roundtrip --test faults --test stream --test fuzz_corpus --test alloc

echo "== drivers' conformance suite on shm"
BAREWIRE_REACTOR=io_uring BAREWIRE_DRIVER=shm test_asan -p barewire-drivers --test conformance

echo "== the facade: channels, DSM, actors, cluster (io_uring reactor)"
BAREWIRE_REACTOR=io_uring test_asan -p barewire --lib --tests

echo "== the soak: three processes under kills and stops, soft then shm (30 s each)"
cargo +nightly build --target "$TARGET" -p barewire-bench --bin barewire-soak
soak="$CARGO_TARGET_DIR/$TARGET/debug/barewire-soak"
for driver in soft shm; do
    log=$(mktemp)
    # A worker's report goes to its standard error, which the soak passes on: look for it too.
    "$soak" --seconds 30 --seed "$(date +%s)" --fault-every-ms 3000 --net loopback \
        --driver $driver --faults kill,stop 2>&1 | tee "$log"
    if grep -q "Sanitizer" "$log"; then
        echo "scripts/asan.sh: a sanitizer report in the $driver soak (above)" >&2
        exit 1
    fi
    rm -f "$log"
done

echo "scripts/asan.sh: no report"
