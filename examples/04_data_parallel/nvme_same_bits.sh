#!/usr/bin/env bash
# The data-parallel demo on 2 ranks under ZeRO-3 with the NVMe tier (--host-budget: each rank's
# optimizer state past it in a file of its own) trains to the bits of the same run without it,
# through a checkpoint set saved and resumed with the tier on.
#   nvme_same_bits.sh MPIEXEC PROGRAM DIR
# 1. 30 steps without the tier: the straight run's CRC-32C.
# 2. 20 steps with --host-budget 3MiB, a checkpoint at step 20; its host bytes must be below the
#    straight run's.
# 3. Resumed with the tier to step 30, every block's activations recomputed and offloaded to the
#    host as well (all bit-identical): the straight run's CRC.
set -euo pipefail
mpiexec=$1 program=$2 dir=$3
rm -rf "$dir"
mkdir -p "$dir"
launch=("$mpiexec" -q -n 2 --oversubscribe --allow-run-as-root --bind-to none "$program" --zero 3 --batch 4 --seq 32)
tier=(--host-budget 3MiB --spill-folder "$dir/spill")
source "$(dirname "$0")/common.sh"

"${launch[@]}" --steps 30 --checkpoint-every 0 --checkpoint-dir "$dir/straight" >"$dir/straight.log" 2>&1 ||
  { cat "$dir/straight.log"; fail "the straight run failed"; }
"${launch[@]}" "${tier[@]}" --steps 20 --checkpoint-every 20 --checkpoint-dir "$dir/tier" >"$dir/tier.log" 2>&1 ||
  { cat "$dir/tier.log"; fail "the run with the NVMe tier failed"; }
"${launch[@]}" "${tier[@]}" --steps 30 --checkpoint-dir "$dir/tier" --resume "$dir/tier/run-001" \
  --recompute --offload-activations \
  >"$dir/resumed.log" 2>&1 || { cat "$dir/resumed.log"; fail "the resumed run failed"; }
straight=$(crc_of "$dir/straight.log") resumed=$(crc_of "$dir/resumed.log")
plain_host=$(host_of "$dir/straight.log") tier_host=$(host_of "$dir/tier.log")
echo "straight: $straight, host $plain_host MiB; with the tier, resumed at step 20: $resumed, host $tier_host MiB"
[ -n "$straight" ] || fail "the straight run printed no digest"
[ "$resumed" = "$straight" ] || fail "the run with the NVMe tier differs from the straight run"
awk -v a="$tier_host" -v b="$plain_host" 'BEGIN { exit !(a < b) }' ||
  fail "the NVMe tier kept $tier_host MiB on the host, not below the $plain_host MiB without it"
