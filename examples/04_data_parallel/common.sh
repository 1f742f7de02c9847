# What the data-parallel demo's test scripts share; sourced by them, not run.
fail() { echo "FAIL: $*"; exit 1; }
crc_of() { grep -o 'crc32c [0-9a-f]*' "$1" | tail -n 1; }                         # the last digest
host_of() { grep -o 'host [0-9.]* MiB' "$1" | tail -n 1 | grep -o '[0-9.]*'; }   # the last host MiB
wait_for() { for _ in $(seq 1 1200); do grep -q "$2" "$1" && return 0; sleep 0.05; done; fail "no '$2' in $1"; }

# stop_at_random JOB LOG LINE STEPS: once LINE shows in LOG, SIGUSR1 to mpiexec (JOB, what
# ./tide demo sends it on Ctrl-C) 0 to 0.3 s later; the job must exit 130 with every rank's stop
# after the same step reported. Sets `pause` (the delay) and `at` (the step it stopped after).
stop_at_random() {
  local job=$1 log=$2 line=$3 steps=$4 rc=0
  wait_for "$log" "$line"
  pause=$(printf '0.%03d' $((RANDOM % 300)))
  sleep "$pause"
  kill -USR1 "$job"
  wait "$job" || rc=$?
  grep -v '^step' "$log"
  [ "$rc" -eq 130 ] || fail "exit status $rc after SIGUSR1 to mpiexec, want 130"
  at=$(grep -o "stopped by SIGINT after step [0-9]* of $steps on every rank" "$log" | grep -o 'step [0-9]*' |
       grep -o '[0-9]*') || fail "no 'stopped by SIGINT ... on every rank' report"
}
