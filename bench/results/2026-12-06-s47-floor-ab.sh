#!/bin/bash
# Alternated: the syscall and ring floors (tcp-floor), sockperf --nonblocked, barewire write_lat on both reactors.
BP=${BP:-/work/main/target/release/barewire-perf}
TF=/work/main/target/release/tcp-floor
for r in $(seq 1 ${ROUNDS:-5}); do
  echo "== round $r $(date -u +%T)"
  $TF -n 50000 --reps 1 | grep "^rep" | sed 's/^rep 0: /tcp-floor /'
  taskset -c 1 sockperf server --tcp -i 127.0.0.1 -p 11119 --nonblocked > /dev/null 2>&1 &
  S=$!; sleep 0.5
  echo -n "sockperf --nonblocked p50 RTT/2: "; taskset -c 0 sockperf ping-pong --tcp -i 127.0.0.1 -p 11119 -m 14 -t 2 --nonblocked 2>&1 | grep "50.000" | awk '{print $NF}'
  kill $S; wait $S 2>/dev/null
  for re in io_uring epoll; do echo -n "barewire write_lat $re: "; $BP write_lat --loopback -s 8 -n 50000 --cpu 0,1 --reactor $re 2>&1 | grep "^ 8 " | awk '{print "p50", $5, "avg", $6}'; done
done
