#!/bin/bash
# 2026-12-06 s53: slow hops in barewire's 8 B WRITE ping-pong and in the bare io_uring floor, from
# both sides' timelines, with the vCPUs' speed probed around each pair of runs.
# Needs a build with the timeline: cargo build --release -p barewire-bench --features trace
#   BIN=target/release ROUNDS=6 N=50000 bash bench/results/2026-12-06-s53-slow-hops.sh
set -u
BIN=${BIN:-target/release}
ROUNDS=${ROUNDS:-6}
N=${N:-50000}
OUT=${OUT:-/tmp/s53}
mkdir -p "$OUT"
gcc -O2 -o "$OUT/cpu-speed" "$(dirname "$0")/2026-12-06-s53-cpu-speed.c"
probe() { echo "round $r: $1: cpu0 $(taskset -c 0 "$OUT/cpu-speed")"; echo "round $r: $1: cpu1 $(taskset -c 1 "$OUT/cpu-speed")"; }
floor() {
  echo "round $r: floor: $("$BIN/tcp-floor" -n "$N" --reps 1 --ways ring --trace "$OUT/f$r" 2>&1 | grep '^rep' | cut -d: -f3-)"
  python3 "$(dirname "$0")/../tools/hop-trace.py" "$OUT/f$r" | sed "s/^/round $r: floor: /"
}
bw() {
  echo "round $r: barewire: $("$BIN/barewire-perf" write_lat --loopback -s 8 -n "$N" --cpu 0,1 --trace "$OUT/b$r" 2>&1 | grep -A1 bytes | tail -1 | awk '{printf "p50 %s µs, mean %s µs, p99 %s µs, p99.9 %s µs", $5, $6, $8, $9}')"
  python3 "$(dirname "$0")/../tools/hop-trace.py" "$OUT/b$r" | sed "s/^/round $r: barewire: /"
}
for r in $(seq 1 "$ROUNDS"); do
  probe before
  if [ $((r % 2)) = 1 ]; then floor; bw; else bw; floor; fi
  probe after
done
