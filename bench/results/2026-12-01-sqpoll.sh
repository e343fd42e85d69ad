#!/bin/bash
# SQPOLL against the plain io_uring ring, each with the cores spinning 1 ms before they sleep
# (barewire-perf's default) and with cores that sleep at once; reps interleaved, CPUs 0,1,
# barewire-perf --loopback (CRC off). Prints each run's p50 (latency) or average MiB/s
# (bandwidth) and the CPU time of both processes (user + sys, from /usr/bin/time: the kernel
# SQ threads belong to the processes) per operation or per MiB.
# Usage: bash bench/results/2026-12-01-sqpoll.sh
B=${B:-target/release/barewire-perf}
REPS=${REPS:-3}
N=${N:-5000}
run() { # variant-flags -- test size extra...
  local flags=$1; shift
  local t=$1 s=$2; shift 2
  local out
  out=$( { /usr/bin/time -f "CPU %U %S" $B $t --loopback -s $s --cpu 0,1 --json $flags "$@" 2>&1; } | tail -2)
  python3 - "$t" "$s" "$flags" "$out" <<'PY'
import json, sys
t, s, flags, out = sys.argv[1:]
lines = out.splitlines()
r = json.loads(next(l for l in lines if l.startswith("{")))
u, k = map(float, next(l for l in lines if l.startswith("CPU")).split()[1:])
if "bw_avg_mib_s" in r:
    fig, unit = r["bw_avg_mib_s"], "MiB/s"
    per = (u + k) / (r["bw_avg_mib_s"] * r.get("seconds", 2.0)) * 1e6
    per_unit = "us CPU per MiB (approx., 2 s run)"
else:
    fig, unit = r["t_typical_us"], "us p50"
    per = (u + k) / r["iterations"] * 1e6
    per_unit = "us CPU per op"
print(f"{t} {s} [{flags or 'plain'}]: {fig:.2f} {unit}, p99 {r.get('p99_us', 0):.1f}, CPU {u:.2f}+{k:.2f} s = {per:.1f} {per_unit}")
PY
}
for rep in $(seq $REPS); do
  for spec in "write_lat 8 -n $N" "read_lat 8 -n $N" "atomic_lat 8 -n $N" "write_bw 1048576 -D 2"; do
    for flags in "" "--sqpoll 10" "--idle-spin-us 0" "--sqpoll 10 --idle-spin-us 0"; do
      echo "rep $rep: $(run "$flags" $spec)"
    done
  done
done
