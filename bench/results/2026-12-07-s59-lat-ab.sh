#!/bin/bash
# usage: lat-ab.sh ROUNDS BIN_A BIN_B "test args"...  (p50 of 8 B latency runs, alternated)
rounds=$1 a=$2 b=$3; shift 3
for r in $(seq 1 $rounds); do
  for t in "$@"; do
    for bin in "$a" "$b"; do
      p50=$($bin ${t%% *} --loopback ${t#* } -n 20000 --cpu 0,1 2>&1 | awk '$1=="8" && NF>=9 {print $5}' | tail -1)
      echo "$r $(basename $bin) $t $p50"
    done
  done
done
