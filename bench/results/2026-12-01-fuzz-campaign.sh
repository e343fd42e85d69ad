#!/usr/bin/env bash
# Each fuzz target to 10 M executions or 30 minutes, one worker, seeded from the repo's corpus.
cd "$(dirname "$0")/../.."  # the repository root
export PATH="$HOME/.cargo/bin:$PATH"
mkdir -p /tmp/fz
cargo +nightly fuzz build > /tmp/fz/build.log 2>&1 || { echo "BUILD FAILED" >> /tmp/fz/summary.txt; exit 1; }
for t in control mpa_private_data mpa_handshake ddp_rdmap deframer bare_channel local_channel live_stream; do
  mkdir -p /tmp/fz/$t
  [ -d fuzz/corpus/$t ] && cp -n fuzz/corpus/$t/* /tmp/fz/$t/ 2>/dev/null
  start=$(date +%s)
  cargo +nightly fuzz run $t /tmp/fz/$t -- -runs=10000000 -max_total_time=1800 -print_final_stats=1 > /tmp/fz/$t.full.log 2>&1
  rc=$?
  end=$(date +%s)
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' /tmp/fz/$t.full.log | awk '{print $2}')
  eps=$(grep -o 'stat::average_exec_per_sec: *[0-9]*' /tmp/fz/$t.full.log | awk '{print $2}')
  crashes=$(ls fuzz/artifacts/$t 2>/dev/null | wc -l)
  echo "$t rc=$rc seconds=$((end-start)) execs=$execs exec_per_s=$eps corpus=$(ls /tmp/fz/$t | wc -l) artifacts=$crashes" >> /tmp/fz/summary.txt
done
echo ALLDONE >> /tmp/fz/summary.txt
