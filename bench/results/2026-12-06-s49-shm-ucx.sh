#!/bin/bash
# The shm one-sided rows beside UCX's shared-memory transports, alternated: per round, each
# barewire build given (A, B, ...) runs write_lat, read_lat and atomic_lat (8 B, 300,000
# iterations, CPUs 0 and 1), then ucx_perftest runs ucp_put_lat, ucp_get and ucp_fadd (8 B,
# 300,000 iterations) and shm-floor its bare store-and-spin. Prints one line per figure:
# round, what, p50 (µs), mean (µs).
# Usage, from the repository root (shm-floor is taken from target/release):
#   ROUNDS=6 bash bench/results/2026-12-06-s49-shm-ucx.sh BIN_A [BIN_B ...]
set -u
ROUNDS=${ROUNDS:-6}
N=300000
export UCX_TLS=posix,sysv,cma,self
ucx() {
    taskset -c 1 ucx_perftest -p 13379 >/dev/null 2>&1 &
    local srv=$!
    sleep 0.5
    taskset -c 0 ucx_perftest 127.0.0.1 -p 13379 -t "$1" -s 8 -n $N 2>/dev/null |
        awk '/^Final:/ {print $3, $4}'
    wait $srv
}
for r in $(seq "$ROUNDS"); do
    for bin in "$@"; do
        for t in write_lat read_lat atomic_lat; do
            "$bin" $t --loopback -s 8 -n $N --cpu 0,1 --driver shm --json 2>/dev/null | tail -1 |
                python3 -c 'import json,sys; d=json.load(sys.stdin); print(d["t_typical_us"], round(d["t_avg_us"], 4))' |
                sed "s|^|$r $(basename "$bin") $t |"
        done
    done
    for t in ucp_put_lat ucp_get ucp_fadd; do
        echo "$r ucx $t $(ucx $t)"
    done
    echo "$r floor shm $(target/release/shm-floor -n $N --reps 1 --gaps 0 2>/dev/null |
        awk -F'|' '/^\| 0 turns/ {gsub(/[^0-9.]/, "", $3); gsub(/[^0-9.]/, "", $4); print $3, $4}')"
done
