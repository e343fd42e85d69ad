#!/bin/bash
# usage: ab.sh ROUNDS BIN_A BIN_B
for r in $(seq 1 $1); do
  for b in "$2" "$3"; do
    out=$($b write_lat --loopback -s 8 -n 100000 --cpu 0,1 --driver shm --floor-slices 1000 --json | tail -1)
    python3 -c "
import json,sys
d=json.loads(sys.argv[1]); w=d['write']; s=d['store']
print(f\"$r $(basename $b) ratio {d['ratio']:.3f} p50 {w['t_typical_us']*1000:.0f}-{s['t_typical_us']*1000:.0f} diff {1000*(w['t_typical_us']-s['t_typical_us']):.0f} ns mean-diff {1000*(w['t_avg_us']-s['t_avg_us']):.1f} ns\")" "$out"
  done
done
