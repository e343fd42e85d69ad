#!/usr/bin/env bash
# Runs barewire's software RDMA provider (softrdma-perf) and the peers installed here, on the
# same two pinned cores in the same session, and prints every figure it collected:
#   fi_pingpong -p tcp -e msg, ucx_perftest with UCX_TLS=tcp (put_lat, get, add, put_bw),
#   qperf tcp_bw. A missing peer is reported by name, not skipped silently.
# Usage: bench/compare-soft.sh [REPS]   (REPS runs of each, interleaved; default 3)
set -uo pipefail
cd "$(dirname "$0")/.."
reps=${1:-3}
cargo build -q --release -p barewire-bench --bin softrdma-perf
perf=target/release/softrdma-perf
export UCX_TLS=tcp UCX_NET_DEVICES=lo
have() { command -v "$1" >/dev/null || { echo "MISSING peer: $1 (apt-get install $2)"; return 1; }; }

ucx() { # test size [extra]
  taskset -c 1 timeout 60 ucx_perftest >/dev/null 2>&1 & sleep 0.5
  taskset -c 0 timeout 60 ucx_perftest 127.0.0.1 -t "$1" -s "$2" -n 20000 ${3:-} 2>&1 | awk '/Final:/ {print "ucx", "'"$1"'", "'"$2"'", "p50_us=" $3, "avg_us=" $4, "bw_mb_s=" $6}'
  wait
}
fi_pp() {
  taskset -c 1 timeout 60 fi_pingpong -p tcp -e msg -S 8 -I 20000 >/dev/null 2>&1 & sleep 0.5
  taskset -c 0 timeout 60 fi_pingpong -p tcp -e msg -S 8 -I 20000 127.0.0.1 2>&1 | awk '$1=="8" {print "fi_pingpong 8 usec_per_xfer=" $7}'
  wait
}
qp_bw() {
  taskset -c 1 timeout 60 qperf >/dev/null 2>&1 & sleep 0.5
  taskset -c 0 timeout 60 qperf 127.0.0.1 -t 3 -m 1M tcp_bw 2>&1 | awk '/bw/ {print "qperf tcp_bw 1M bw=" $3, $4}'
  taskset -c 0 timeout 60 qperf 127.0.0.1 quit >/dev/null 2>&1
  wait
}

date -u +"# %Y-%m-%d %H:%M UTC, $(nproc) cores, $(uname -r)"
for r in $(seq "$reps"); do
  echo "## rep $r"
  for crc in "" "--crc"; do
    $perf write_lat -s 8 -n 20000 $crc
    $perf read_lat -s 8 -n 20000 $crc
    $perf fadd_lat -n 20000 $crc
    $perf cas_lat -n 20000 $crc
    $perf write_bw -s 1048576 -D 3 $crc
    $perf write_bw -s 65536 -D 3 $crc
    $perf read_bw -s 65536 -D 3 $crc
  done
  have fi_pingpong libfabric-bin && fi_pp
  if have ucx_perftest ucx-utils; then
    ucx ucp_put_lat 8; ucx ucp_get 8; ucx ucp_add 8
    ucx ucp_put_bw 1048576; ucx ucp_put_bw 65536
  fi
  have qperf qperf && qp_bw
done
