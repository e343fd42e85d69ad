#!/bin/bash
# Sixty-second session: copy_bulk's blocks (AVX2 intrinsics, destination-aligned) against the
# previous build (blocks through the stack) and a build whose copy_bulk is plain memcpy
# (BULK_FROM = usize::MAX), alternated round by round. Usage: ROUNDS base new memcpy
set -u
rounds=$1; shift
bins=("$@")
for r in $(seq 1 "$rounds"); do
  for size in 8192 65536 1048576; do
    for off in 16 0; do
      for b in "${bins[@]}"; do
        bw=$("$b" write_bw --loopback -s "$size" -D 2 --cpu 0,1 --driver shm --remote-offset "$off" 2>&1 | tail -2 | head -1 | awk '{print $4}')
        echo "round $r shm size $size off $off $(basename "$b") $bw"
      done
    done
  done
  for b in "${bins[@]}"; do
    bw=$("$b" write_bw --loopback -s 1048576 -D 2 --cpu 0,1 2>&1 | tail -2 | head -1 | awk '{print $4}')
    echo "round $r soft size 1048576 off 0 $(basename "$b") $bw"
  done
done
