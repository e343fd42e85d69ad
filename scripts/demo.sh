#!/usr/bin/env bash
# The main job: installs what is missing, then runs the barewire tour — three nodes (three
# processes) on loopback over barewire's drivers (the software provider, iWARP over TCP, where
# there is no RDMA hardware): typed one-sided operations, a channel and a fan-out, with what
# each costs; then three processes sharing memory (a counter, a histogram and a record updated
# concurrently from every node, checked for lost updates); then a supervision tree across three
# processes, one of them killed and its actor restarted on a survivor.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
# The software provider (iWARP over TCP through io_uring), barewire's own transport where there
# is no RDMA device. Under `auto`, peers on one host would talk through shared memory instead:
# `BAREWIRE_DRIVER=auto bash scripts/demo.sh` shows that.
export BAREWIRE_DRIVER="${BAREWIRE_DRIVER:-soft}"
cargo run --release --example tour
cargo run --release --example dsm
cargo run --release --example actors
