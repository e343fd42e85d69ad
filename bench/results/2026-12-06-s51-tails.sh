#!/bin/bash
# 2026-12-06 s51: tails (p99, p99.9) of the soft 8 B WRITE ping-pong against its floors, alternated.
# Each round: tcp-floor (two processes; ring and syscalls ways, 1 rep), then barewire-perf
# write_lat on io_uring and on epoll, order of the two reactors alternating by round.
#   ROUNDS=6 N=50000 bash bench/results/2026-12-06-s51-tails.sh
set -u
BIN=${BIN:-target/release}
ROUNDS=${ROUNDS:-6}
N=${N:-50000}
bw() { # reactor
  local l
  l=$(BAREWIRE_REACTOR=$1 "$BIN/barewire-perf" write_lat --loopback -s 8 -n "$N" --cpu 0,1 2>&1 | grep -A1 bytes | tail -1)
  echo "round $r: barewire $1: $(echo "$l" | awk '{printf "p50 %s µs, mean %s µs, p99 %s µs, p99.9 %s µs", $5, $6, $8, $9}')"
}
for r in $(seq 1 "$ROUNDS"); do
  "$BIN/tcp-floor" -n "$N" --reps 1 --ways ring,syscalls 2>&1 | grep '^rep' | sed "s/^rep 0/round $r: floor/"
  if [ $((r % 2)) = 1 ]; then bw io_uring; bw epoll; else bw epoll; bw io_uring; fi
done
