#!/usr/bin/env bash
# The data-parallel demo as a pipeline of 2 stages on 2 ranks (1F1B, 4 micro-batches), stopped
# and resumed, ends on the bits of a straight run.
#   pipeline_resume.sh MPIEXEC PROGRAM DIR
# 1. A straight run of 30 steps must learn (--check-falls 0.5), stay steady (--check-steady 1.0),
#    hold the same tied embedding at both ends, report the bubble, and print its parameters'
#    CRC-32C (each stage's, in stage order).
# 2. SIGUSR1 to mpiexec at a random moment after step 10: both stages finish the same step, the
#    checkpoint set (a shard per stage) is saved, the job exits 130. Resumed from its run folder
#    with recompute and the NVMe tier on (each rank's optimizer state past --host-budget in a file
#    of its own), both bit-identical, it must end on the straight run's CRC with fewer host bytes.
set -euo pipefail
mpiexec=$1 program=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
launch=("$mpiexec" -q -n 2 --oversubscribe --allow-run-as-root --bind-to none "$program"
        --pipeline 2 --steps 30 --batch 2 --seq 64)
source "$(dirname "$0")/common.sh"

rc=0
"${launch[@]}" --check-falls 0.5 --check-steady 1.0 --checkpoint-every 0 --checkpoint-dir "$dir/straight" \
  >"$dir/straight.log" 2>&1 || rc=$?
cat "$dir/straight.log"
[ "$rc" -eq 0 ] || fail "the straight run exited $rc"
grep -q "bubble [0-9]*%" "$dir/straight.log" || fail "the progress line reports no bubble"
grep -q "wte identical at both ends" "$dir/straight.log" || fail "no check of the tied embedding"
straight=$(crc_of "$dir/straight.log")
[ -n "$straight" ] || fail "the straight run printed no digest"

"${launch[@]}" --checkpoint-every 0 --checkpoint-dir "$dir/stopped" >"$dir/stopped.log" 2>&1 &
stop_at_random $! "$dir/stopped.log" "step    10/30" 30
grep -q "continue with: ./tide demo --pipeline 2 --ranks 2 --resume $dir/stopped/run-001" "$dir/stopped.log" ||
  fail "the stop does not say how to continue the pipeline"
[ -f "$dir/stopped/run-001/checkpoint/manifest.tide" ] || fail "the stopped run wrote no checkpoint set"
"${launch[@]}" --checkpoint-dir "$dir/stopped" --resume "$dir/stopped/run-001" --recompute \
  --host-budget 4MiB --spill-folder "$dir/spill" >"$dir/resumed.log" 2>&1 ||
  { cat "$dir/resumed.log"; fail "the resumed run failed"; }
(( $(echo "$(host_of "$dir/resumed.log") < $(host_of "$dir/straight.log")" | bc) )) ||
  fail "the tier kept no host bytes: $(host_of "$dir/resumed.log") MiB against $(host_of "$dir/straight.log")"
grep -q "resumed from .* at step $at;" "$dir/resumed.log" || fail "the resumed run did not start at step $at"
resumed=$(crc_of "$dir/resumed.log")
echo "straight: $straight (host $(host_of "$dir/straight.log") MiB); SIGINT ${pause} s after step 10's line, stopped" \
     "after step $at, resumed with recompute and the NVMe tier: $resumed" \
     "(host $(host_of "$dir/resumed.log") MiB)"
[ "$resumed" = "$straight" ] || fail "the resumed run's parameters differ from the straight run's"
echo "pipeline stopped and resumed as expected"
rm -rf "$dir"
