#!/bin/bash
# Sixty-second session: Channel<[u8; 64]> over shm with the two prefetches (receiver: the slot
# 8 ahead for reading; sender: the slot 8 ahead for writing) against the build before them,
# alternated. Usage: ROUNDS base new [capacity...]
set -u
rounds=$1 a=$2 b=$3; shift 3
caps=("${@:-1024}")
for r in $(seq 1 "$rounds"); do
  for c in "${caps[@]}"; do
    for bin in "$a" "$b"; do
      line=$(timeout 300 "$bin" --reps 1 -n 3000000 --channel-only --driver shm --capacity "$c" 2>&1 | grep '^rep 0')
      echo "$r $(basename "$bin") capacity $c $line"
    done
  done
done
