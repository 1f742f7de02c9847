#!/usr/bin/env bash
# The data-parallel demo on 2 ranks, stopped two ways, resumed, ends on the bits of a straight run.
#   interrupt_resume.sh MPIEXEC PROGRAM DIR
# 1. A straight run of 200 steps (ZeRO-2) prints its parameters' CRC-32C.
# 2. SIGUSR1 to mpiexec (what ./tide demo sends it on Ctrl-C; mpiexec forwards it to every rank)
#    at a random moment after step 20: every rank finishes the same step, the set is saved, the
#    job exits 130 with the pictures and rank 0's timeline written. Resumed from its run folder it
#    must end on the straight run's CRC.
# 3. SIGSTOP on rank 1 after step 30, with --heartbeat 3 and a checkpoint every 5 steps: rank 0
#    must name rank 1, its pid and step and the last checkpoint, and the job must end within
#    15 s. Resumed from that checkpoint it must end on the straight run's CRC.
set -euo pipefail
mpiexec=$1 program=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
launch=("$mpiexec" -q -n 2 --oversubscribe --allow-run-as-root --bind-to none "$program"
        --steps 200 --batch 4 --seq 32)
source "$(dirname "$0")/common.sh"

"${launch[@]}" --checkpoint-every 0 --checkpoint-dir "$dir/straight" >"$dir/straight.log" 2>&1
straight=$(crc_of "$dir/straight.log")
[ -n "$straight" ] || fail "the straight run printed no digest"

"${launch[@]}" --checkpoint-every 0 --checkpoint-dir "$dir/stopped" >"$dir/stopped.log" 2>&1 &
stop_at_random $! "$dir/stopped.log" "step    20/200" 200
for f in checkpoint loss.svg memory-tide.svg step-trace.json; do
  [ -s "$dir/stopped/run-001/$f" ] || [ -d "$dir/stopped/run-001/$f" ] || fail "the stopped run wrote no $f"
done
"${launch[@]}" --checkpoint-dir "$dir/stopped" --resume "$dir/stopped/run-001" >"$dir/resumed.log" 2>&1
grep -q "resumed from .* at step $at;" "$dir/resumed.log" || fail "the resumed run did not start at step $at"
resumed=$(crc_of "$dir/resumed.log")
echo "straight: $straight; SIGINT ${pause} s after step 20's line, stopped after step $at, resumed: $resumed"
[ "$resumed" = "$straight" ] || fail "the resumed run's parameters differ from the straight run's"

"${launch[@]}" --checkpoint-every 5 --heartbeat 3 --checkpoint-dir "$dir/lost" >"$dir/lost.log" 2>&1 &
job=$!
wait_for "$dir/lost.log" "step    30/200"
rank1=""
for pid in $(pgrep -P "$job"); do
  tr '\0' '\n' <"/proc/$pid/environ" | grep -qx 'OMPI_COMM_WORLD_RANK=1' && rank1=$pid
done
[ -n "$rank1" ] || fail "rank 1's process not found among mpiexec's children"
kill -STOP "$rank1"
stopped_at=$(date +%s.%N)
rc=0
wait "$job" || rc=$?
took=$(echo "$(date +%s.%N) - $stopped_at" | bc)
grep -v '^step' "$dir/lost.log"
# mpiexec kills the stopped rank as it ends the job; it may stay a zombie until reaped.
for _ in $(seq 1 100); do
  state=$(ps -o stat= -p "$rank1" || true)
  [ -z "$state" ] || [[ "$state" == Z* ]] && break
  sleep 0.05
done
if [ -n "$state" ] && [[ "$state" != Z* ]]; then kill -KILL "$rank1"; fail "the stopped rank outlived the job"; fi
[ "$rc" -ne 0 ] || fail "the job exited 0 although rank 1 stopped"
echo "the job ended ${took} s after rank 1 stopped"
(( $(echo "$took < 15" | bc) )) || fail "the job took ${took} s to end; the heartbeat should end it within 15 s"
grep -q "rank 0: rank 1 ([^,]*, pid $rank1) stopped answering at step [0-9]*: no heartbeat for [0-9.]* s (timeout 3 s)\. The last checkpoint is $dir/lost/run-001/checkpoint (step [0-9]*): continue with ./tide demo --ranks 2 --resume $dir/lost/run-001" "$dir/lost.log" ||
  fail "rank 0 did not name rank 1, its pid, step and the last checkpoint"
"${launch[@]}" --checkpoint-dir "$dir/lost" --resume "$dir/lost/run-001" >"$dir/lost-resumed.log" 2>&1
grep -q "resumed from .* at step" "$dir/lost-resumed.log" || fail "the run did not resume from the set it wrote"
resumed=$(crc_of "$dir/lost-resumed.log")
echo "after the lost rank, $(grep -o 'resumed from .* at step [0-9]*' "$dir/lost-resumed.log"): $resumed"
[ "$resumed" = "$straight" ] || fail "the run resumed after the lost rank differs from the straight run"
echo "interrupt, lost rank and both resumes as expected"
rm -rf "$dir"
