#!/bin/bash
# Sixteenth session: rounds of UCX ucp_put_lat over shared memory, the shared-memory floor,
# barewire-perf write_lat --driver shm with two builds (BEFORE, AFTER), and UCX again.
#   BEFORE=/path/to/old/barewire-perf AFTER=target/release/barewire-perf bash this.sh 10
set -u
BEFORE=${BEFORE:-target/release/barewire-perf}
AFTER=${AFTER:-target/release/barewire-perf}
ucx() {
  UCX_TLS=posix,sysv,cma,self taskset -c 1 ucx_perftest -p 13340 >/dev/null 2>&1 & local sp=$!
  sleep 0.4
  UCX_TLS=posix,sysv,cma,self taskset -c 0 ucx_perftest 127.0.0.1 -p 13340 -t ucp_put_lat -s 8 -n 1000000 2>&1 |
    grep Final | awk '{print $3, $4}'
  wait $sp
}
ours() {
  "$1" write_lat --loopback -s 8 -n 1000000 --cpu 0,1 --driver shm --json 2>/dev/null | python3 -c 'import json,sys
for l in sys.stdin:
  try: d=json.loads(l)
  except Exception: continue
  if "t_typical_us" in d: print("%.3f %.3f" % (d["t_typical_us"], d["t_avg_us"]))'
}
for r in $(seq "${1:-8}"); do
  f=$(target/release/shm-floor --reps 1 --gaps 0 2>&1 | grep "0 turns" | awk -F'|' '{print $3}' | tr -d ' µs')
  echo "r$r ucx $(ucx) | floor $f | base $(ours "$BEFORE") | new $(ours "$AFTER") | ucx $(ucx)"
done
