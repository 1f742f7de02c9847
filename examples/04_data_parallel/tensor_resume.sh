#!/usr/bin/env bash
# The data-parallel demo with its layers split over tensor-parallel groups of 2 (sequence
# parallel), two groups data-parallel on 4 ranks, stopped and resumed, ends on the bits of a
# straight run; the checkpoint set then loads as one replica of two pipeline stages of groups of 2.
#   tensor_resume.sh MPIEXEC PROGRAM DIR
# 1. A straight run of 30 steps must learn (--check-falls 0.5), stay steady (--check-steady 1.0),
#    keep each shard the same on its replicas and each replicated tensor the same on its group, and
#    print the whole tensors' CRC-32C.
# 2. SIGUSR1 to mpiexec at a random moment after step 10: every rank finishes the same step, the
#    checkpoint set is saved, the job exits 130. Resumed at the same shape it must end on the
#    straight run's CRC.
# 3. The stopped run's set, (t, p, d) = (2, 1, 2), resumed at (2, 2, 1) with 2 micro-batches a
#    step (each stage reads its blocks' shards; the data goes on from the windows the job drew),
#    trains on to step 30, stays steady and ends on the straight run's loss within 0.002: the same
#    tokens and updates, summed in another order (2 micro-steps for 2 replicas) for at most 20
#    steps; a shifted data stream ends 0.1 away.
set -euo pipefail
mpiexec=$1 program=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
launch=("$mpiexec" -q -n 4 --oversubscribe --allow-run-as-root --bind-to none "$program" --steps 30 --batch 2
        --seq 64)
source "$(dirname "$0")/common.sh"

rc=0
"${launch[@]}" --tensor 2 --sequence-parallel --check-falls 0.5 --check-steady 1.0 --checkpoint-every 0 \
  --checkpoint-dir "$dir/straight" >"$dir/straight.log" 2>&1 || rc=$?
cat "$dir/straight.log"
[ "$rc" -eq 0 ] || fail "the straight run exited $rc"
grep -q "each shard identical on its replicas, each replicated tensor identical on its group" "$dir/straight.log" ||
  fail "no check of the shards"
straight=$(crc_of "$dir/straight.log")
[ -n "$straight" ] || fail "the straight run printed no digest"

"${launch[@]}" --tensor 2 --sequence-parallel --checkpoint-every 0 --checkpoint-dir "$dir/stopped" \
  >"$dir/stopped.log" 2>&1 &
stop_at_random $! "$dir/stopped.log" "step    10/30" 30
grep -q "continue with: ./tide demo --tensor 2 --ranks 4 --resume $dir/stopped/run-001" "$dir/stopped.log" ||
  fail "the stop does not say how to continue"
cp -r "$dir/stopped" "$dir/regrouped"
"${launch[@]}" --tensor 2 --sequence-parallel --checkpoint-dir "$dir/stopped" --resume "$dir/stopped/run-001" \
  >"$dir/resumed.log" 2>&1 || { cat "$dir/resumed.log"; fail "the resumed run failed"; }
grep -q "resumed from .* at step $at;" "$dir/resumed.log" || fail "the resumed run did not start at step $at"
resumed=$(crc_of "$dir/resumed.log")
echo "straight: $straight; SIGINT ${pause} s after step 10's line, stopped after step $at, resumed: $resumed"
[ "$resumed" = "$straight" ] || fail "the resumed run's parameters differ from the straight run's"

"${launch[@]}" --tensor 2 --pipeline 2 --micro 2 --check-steady 1.0 --checkpoint-dir "$dir/regrouped" \
  --resume "$dir/regrouped/run-001" >"$dir/regrouped.log" 2>&1 ||
  { cat "$dir/regrouped.log"; fail "the run resumed in pipelines of groups of 2 failed"; }
grep -q "tensor parallel in groups of 2 in pipelines of 2 stages (1F1B) x 1" "$dir/regrouped.log" ||
  fail "the regrouped run is not in 2 stages of groups of 2"
grep -q "resumed from .* at step $at;" "$dir/regrouped.log" || fail "the regrouped run did not start at step $at"
grep -q "parameters after step 30" "$dir/regrouped.log" || fail "the regrouped run did not reach step 30"
last_loss() { grep -o 'loss [0-9.]* -> [0-9.]*' "$1" | tail -n 1 | grep -o '[0-9.]*$' || true; }
want=$(last_loss "$dir/straight.log") got=$(last_loss "$dir/regrouped.log")
echo "the set of groups of 2 x 2 replicas resumed in 2 stages of groups of 2: last loss $got, straight run's $want"
awk -v a="$got" -v b="$want" 'BEGIN { d = a - b; exit !(d <= 0.002 && -d <= 0.002) }' ||
  fail "the regrouped run ends on loss $got, the straight run on $want"
echo "tensor parallel stopped, resumed and regrouped as expected"
rm -rf "$dir"
