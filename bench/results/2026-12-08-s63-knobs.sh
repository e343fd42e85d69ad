#!/bin/bash
# Sixty-third session: Channel<[u8; 64]> over shm at 1,024 slots under the experimental knobs of
# 2026-12-08-s63-knobs.patch (BW_PUB: messages per published run on the direct path; BW_STEP_DIV:
# credits every capacity/N; BW_AHEAD: slots fetched ahead; BW_DBG: count the sender's full-ring
# waits and the receiver's waits). Usage: ROUNDS binary
set -u
R=$1; for r in $(seq 1 "$R"); do
  for cfg in "0 0 0" "64 8 0" "128 4 0" "0 0 16" "0 0 32"; do
    set -- $cfg
    env BW_DBG=1 $( [ "$1" != 0 ] && echo BW_PUB=$1 ) $( [ "$2" != 0 ] && echo BW_STEP_DIV=$2 ) $( [ "$3" != 0 ] && echo BW_AHEAD=$3 ) \
      timeout 300 "$BIN" --reps 1 -n 3000000 --channel-only --driver shm --capacity 1024 2>&1 \
      | grep -E "^rep 0|full|receiver: waits [0-9]+ consumed 9" | sed "s/raw WRITE p50 -, //" | tr '\n' ' ' \
      | sed "s/^/round $r pub $1 step-div $2 ahead $3: /"; echo
  done
done
