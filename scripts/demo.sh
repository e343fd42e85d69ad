#!/usr/bin/env bash
# The main job: installs what is missing, then runs a two-node RDMA demo on loopback over the
# software provider (iWARP over TCP): WRITE, READ, atomics, and what each costs.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo run --release --example rdma_demo
