#!/usr/bin/env bash
# This session's fuzz campaign: each target for a time, one worker, seeded from the repository's
# corpus (cargo-fuzz's defaults: ASan, debug assertions, overflow checks). Stopped after
# bare_channel (local_channel and deframer did not run). Run from the repository root.
export PATH="$HOME/.cargo/bin:$PATH"
mkdir -p /tmp/fz2
cargo +nightly fuzz build > /tmp/fz2/build.log 2>&1 || { echo "BUILD FAILED" >> /tmp/fz2/summary.txt; exit 1; }
for spec in live_stream:900 stream_pair:900 shm_ring:600 bare_channel:540; do
  t=${spec%%:*}; secs=${spec##*:}
  mkdir -p /tmp/fz2/$t
  [ -d fuzz/corpus/$t ] && cp -n fuzz/corpus/$t/* /tmp/fz2/$t/ 2>/dev/null
  start=$(date +%s)
  cargo +nightly fuzz run $t /tmp/fz2/$t -- -max_total_time=$secs -print_final_stats=1 > /tmp/fz2/$t.full.log 2>&1
  rc=$?
  end=$(date +%s)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' /tmp/fz2/$t.full.log | awk '{print $2}')
  echo "$t rc=$rc seconds=$((end-start)) execs=$execs corpus=$(ls /tmp/fz2/$t | wc -l) artifacts=$(ls fuzz/artifacts/$t 2>/dev/null | wc -l)" >> /tmp/fz2/summary.txt
done
