#!/usr/bin/env bash
# The demo stopped by a signal at a random step, then resumed, ends on the bits of a straight run.
#   interrupt_resume.sh PROGRAM DIR
# 1. A straight run of 300 steps prints its parameters' CRC-32C.
# 2. The same run gets SIGINT at a random moment after step 20: it must finish that step, save,
#    write its pictures and exit 130, saying which step it stopped after.
# 3. --resume RUN continues it to step 300: the CRC must be the straight run's, and the loss
#    picture's training curve the straight run's, point for point (it covers the whole run).
# 4. A second SIGINT while the first is served ends the process at once (no "stopped by" report).
set -euo pipefail
program=$1 dir=$2
rm -rf "$dir"
common=(--model tiny --seq 32 --batch 4 --warmup 5 --lr 3e-3 --eval-every 1000 --sample 0 --checkpoint-every 1000
        --steps 300)
fail() { echo "FAIL: $*"; exit 1; }
crc_of() { grep -o 'crc32c [0-9a-f]*' "$1" | tail -n 1; }

"$program" "${common[@]}" --checkpoint-dir "$dir/straight" >"$dir.straight.log"
straight=$(crc_of "$dir.straight.log")
[ -n "$straight" ] || fail "the straight run printed no digest"

# Start, wait for step 20's line, then a random pause of 0-250 ms, then SIGINT.
"$program" "${common[@]}" --checkpoint-dir "$dir/stopped" >"$dir.stopped.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do grep -q "step    20/300" "$dir.stopped.log" && break; sleep 0.05; done
pause=$(printf '0.%03d' $((RANDOM % 250)))
sleep "$pause"
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
cat "$dir.stopped.log"
[ "$rc" -eq 130 ] || fail "exit status $rc after SIGINT, want 130"
grep -q "stopped by SIGINT after step [0-9]* of 300" "$dir.stopped.log" || fail "no 'stopped by SIGINT' report"
at=$(grep -o "stopped by SIGINT after step [0-9]*" "$dir.stopped.log" | grep -o '[0-9]*$')
echo "SIGINT ${pause} s after step 20's line: stopped after step $at"
for f in checkpoint.tide loss.svg memory-tide.svg step-trace.json; do
  [ -s "$dir/stopped/run-001/$f" ] || fail "the stopped run wrote no $f"
done

"$program" "${common[@]}" --checkpoint-dir "$dir/stopped" --resume "$dir/stopped/run-001" >"$dir.resumed.log"
grep -q "resumed from .* at step $at" "$dir.resumed.log" || fail "the resumed run did not start at step $at"
resumed=$(crc_of "$dir.resumed.log")
echo "straight: $straight; stopped at $at and resumed: $resumed"
[ "$resumed" = "$straight" ] || fail "the resumed run's parameters differ from the straight run's"
cmp -s <(grep 'polyline class="train"' "$dir/straight/run-001/loss.svg") \
       <(grep 'polyline class="train"' "$dir/stopped/run-001/loss.svg") ||
  fail "the resumed run's loss picture is not the straight run's training curve"

# Steps of tens of milliseconds (the small model), so that the second signal, 30 ms after the
# first, comes while the first is still being served (signals sent back to back merge into one).
"$program" --model small --batch 8 --steps 300 --sample 0 --checkpoint-dir "$dir/twice" >"$dir.twice.log" 2>&1 &
pid=$!
for _ in $(seq 1 600); do grep -q "validation loss" "$dir.twice.log" && break; sleep 0.05; done
sleep 0.2
kill -INT "$pid"
sleep 0.03
kill -INT "$pid"
rc=0
wait "$pid" || rc=$?
[ "$rc" -eq 130 ] || fail "exit status $rc after two SIGINTs, want 130 (killed by SIGINT)"
! grep -q "stopped by" "$dir.twice.log" || fail "the second SIGINT did not end the process at once"
echo "interrupt, resume and a second SIGINT as expected"
rm -rf "$dir" "$dir".*.log
