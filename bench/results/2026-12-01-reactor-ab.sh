#!/bin/bash
# io_uring data path against the epoll fallback, A/B alternated 10 times per test on CPUs 0,1
# (barewire-perf --loopback, CRC off); prints each run's figure, then the median of the
# per-pair ratios (io_uring ÷ epoll). Usage: bash bench/results/2026-12-01-reactor-ab.sh
B=${B:-target/release/barewire-perf}
REPS=${REPS:-10}
fig() { # test size extra... -> p50 (latency) or average MiB/s (bandwidth)
  local t=$1 s=$2; shift 2
  $B $t --loopback -s $s --cpu 0,1 --json "$@" 2>/dev/null | tail -1 |
    python3 -c 'import json,sys; r=json.loads(sys.stdin.read()); print(r.get("t_typical_us", r.get("bw_avg_mib_s")))'
}
for spec in "write_lat 8 -n 20000" "read_lat 8 -n 20000" "atomic_lat 8 -n 20000" "write_bw 1048576 -D 2" "write_bw 4096 -D 2 --qps 64"; do
  set -- $spec
  ratios=()
  for i in $(seq $REPS); do
    u=$(fig "$@" --reactor io_uring); e=$(fig "$@" --reactor epoll)
    r=$(python3 -c "print(f'{$u/$e:.3f}')")
    echo "$spec rep $i: io_uring $u epoll $e ratio $r"
    ratios+=($r)
  done
  python3 -c "import statistics,sys; v=sorted(map(float,sys.argv[2:])); print(f'== {sys.argv[1]}: median io_uring/epoll {statistics.median(v):.3f} (range {v[0]:.2f}-{v[-1]:.2f}, {len(v)} pairs)')" "$spec" "${ratios[@]}"
done
