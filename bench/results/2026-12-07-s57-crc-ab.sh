#!/bin/bash
# usage: [MODE=lat] crc-ab.sh ROUNDS BIN_A BIN_B [TEST...]
# Alternates the two builds run by run. By default on bandwidth runs (-D 2), printing each run's
# average MiB/s; with MODE=lat on 8 B latency runs (-n 20000), printing each run's p50 in µs. The
# tests default to the CRC-on runs of the fifty-seventh session and one CRC-off control; the
# fifty-eighth session passed "read_bw -s 65536 --crc" "read_bw -s 65536", the fifty-ninth
# "write_bw -s 16384 --reactor epoll" ... and, with MODE=lat, "write_lat -s 8 --reactor epoll" ...
rounds=$1 a=$2 b=$3; shift 3
tests=("$@")
[ ${#tests[@]} -eq 0 ] && tests=("read_bw -s 65536 --crc" "write_bw -s 1048576 --crc" \
  "write_bw -s 65536 --crc" "read_bw -s 65536")
if [ "$MODE" = lat ]; then
  length=(-n 20000) pick='$1=="8" && NF>=9 {print $5}'
else
  length=(-D 2) pick='$1 ~ /^[0-9]+$/ && NF==5 {print $4}'
fi
for r in $(seq 1 $rounds); do
  for t in "${tests[@]}"; do
    for bin in "$a" "$b"; do
      v=$($bin ${t%% *} --loopback ${t#* } "${length[@]}" --cpu 0,1 2>&1 | awk "$pick" | tail -1)
      echo "$r $(basename $bin) $t $v"
    done
  done
done
