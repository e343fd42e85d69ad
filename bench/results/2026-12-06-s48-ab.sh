#!/bin/bash
# Alternated A/B of two barewire-perf builds (A=$A, B=$B), soft over io_uring, 8 B WRITE and
# READ p50 and fetch-add p50, then the bare-ring floor (tcp-floor --threads, ring way) in the
# same round. Order inside a round flips every round.
A=${A:?the build before} B=${B:?the build after}
TF=${TF:-/work/main/target/release/tcp-floor}
for r in $(seq 1 ${ROUNDS:-6}); do
  echo "== round $r $(date -u +%T)"
  if [ $((r % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  for t in write_lat read_lat atomic_lat; do
    for w in $order; do
      bin=$A; [ $w = B ] && bin=$B
      echo -n "$w $t: "
      $bin $t --loopback -s 8 -n 30000 --cpu 0,1 2>&1 | grep "^ 8 " | awk '{print "p50", $5, "avg", $6}'
    done
  done
  [ -x "$TF" ] && $TF -n 30000 --reps 1 --threads --ways ring | grep "^rep" | sed 's/^rep 0: /floor /'
done
