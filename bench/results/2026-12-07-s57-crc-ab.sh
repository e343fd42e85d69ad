#!/bin/bash
# usage: crc-ab.sh ROUNDS BIN_A BIN_B [TEST...]
# Alternates the two builds on bandwidth runs, printing the average MiB/s of each run. The tests
# default to the CRC-on runs of the fifty-seventh session and one CRC-off control; the
# fifty-eighth session passed "read_bw -s 65536 --crc" "read_bw -s 65536".
rounds=$1 a=$2 b=$3; shift 3
tests=("$@")
[ ${#tests[@]} -eq 0 ] && tests=("read_bw -s 65536 --crc" "write_bw -s 1048576 --crc" \
  "write_bw -s 65536 --crc" "read_bw -s 65536")
for r in $(seq 1 $rounds); do
  for t in "${tests[@]}"; do
    for bin in "$a" "$b"; do
      avg=$($bin ${t%% *} --loopback ${t#* } -D 2 --cpu 0,1 2>&1 | awk '$1 ~ /^[0-9]+$/ && NF==5 {print $4}' | tail -1)
      echo "$r $(basename $bin) $t $avg"
    done
  done
done
