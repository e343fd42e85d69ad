#!/bin/bash
# Alternated A/B of two barewire-perf builds (A=$A, B=$B): 8 B send_lat p50 with both cores
# sleeping between messages (--idle-spin-us 0 --gap-us 200), soft and shm, under each reactor;
# then spinning 8 B write_lat p50, the same four ways. Order inside a round flips every round.
# SPIN=0 leaves the spinning part out; CPU= runs the sleeping part unpinned. Run from the
# repository root.
A=${A:?the build before} B=${B:?the build after}

# $1: a label; the rest: the test and its options. Each driver, each reactor, both builds.
four_ways() {
  local label=$1; shift
  for drv in soft shm; do
    for reactor in epoll io_uring; do
      for w in $order; do
        bin=$A; [ $w = B ] && bin=$B
        echo -n "$w $label $drv $reactor: "
        BAREWIRE_REACTOR=$reactor $bin "$@" --loopback --driver $drv -s 8 2>&1 \
          | grep "^ 8 " | awk '{print "p50", $5, "avg", $6}'
      done
    done
  done
}

for r in $(seq 1 ${ROUNDS:-6}); do
  echo "== round $r $(date -u +%T)"
  if [ $((r % 2)) = 1 ]; then order="A B"; else order="B A"; fi
  # (Unquoted on purpose: CPU= gives no --cpu option at all.)
  four_ways "sleeping send_lat" send_lat -n 3000 --idle-spin-us 0 --gap-us 200 ${CPU---cpu 0,1}
  [ "${SPIN:-1}" = 0 ] && continue
  four_ways "spinning write_lat" write_lat -n 20000 --cpu 0,1
done
