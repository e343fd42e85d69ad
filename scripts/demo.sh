#!/usr/bin/env bash
# The main job: installs what is missing, then runs the two-core TCP echo with a latency summary.
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/setup.sh
cargo run --release --example echo
