#!/bin/bash
# usage: crc-ab.sh ROUNDS BIN_A BIN_B
# Alternates the two builds on CRC-on bandwidth runs (and one CRC-off control), printing the
# average MiB/s of each run.
for r in $(seq 1 $1); do
  for t in "read_bw -s 65536 --crc" "write_bw -s 1048576 --crc" "write_bw -s 65536 --crc" "read_bw -s 65536"; do
    for b in "$2" "$3"; do
      avg=$($b ${t%% *} --loopback ${t#* } -D 2 --cpu 0,1 2>&1 | awk '$1 ~ /^[0-9]+$/ && NF==5 {print $4}' | tail -1)
      echo "$r $(basename $b) $t $avg"
    done
  done
done
