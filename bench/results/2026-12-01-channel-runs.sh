#!/bin/bash
# Channel bursts: runs of 64 messages per WRITE (the code before this change, built to
# $BASE) against runs of up to 64 KiB (this change, $NEW), and the new code with CRC off
# (BAREWIRE_CRC=off: the trusted-link switch; tokio's TCP has no checksum of its own either).
# Alternated, REPS times; each run is one full channel-bench rep (the channel and its tokio
# peers back to back, CPUs 0,1).
BASE=${BASE:-/tmp/cb-base}
NEW=${NEW:-target/release/channel-bench}
REPS=${REPS:-5}
for i in $(seq $REPS); do
  echo "rep $i base: $($BASE --reps 1 -n 2000000 2>&1 | grep '^rep 0')"
  echo "rep $i new: $($NEW --reps 1 -n 2000000 2>&1 | grep '^rep 0')"
  echo "rep $i new crc-off: $(BAREWIRE_CRC=off $NEW --reps 1 -n 2000000 2>&1 | grep '^rep 0')"
done
