#!/usr/bin/env bash
# predictive with its key aged by arrival (--predictive-aging 5: a halving of the predicted
# output left is worth 5 s of waiting) on the real cluster: the issue's 0.85-load workload
# (96 held-out prompts, natural lengths, batch 8, a fresh worker per run), FCFS and predictive
# in two rounds, FCFS before and after every run, at 0.85 of the capacity measured first.
# Then the same without the aging at the same rate, right after.
# Usage: bash docs/bench-predictive/aging/run.sh   (~32 minutes here)
source "$(dirname "${BASH_SOURCE[0]}")/../heldout_085.sh"
D=docs/bench-predictive/aging
common+=(--rounds 2)
fastserve bench compare "${common[@]}" --loads 0.85 --scheduler-args "--predictive-aging 5" \
  --out-dir $D/cluster > $D/cluster.log 2>&1
echo finished >> $D/cluster.log
# The same at the same rate without the aging, right after (the side-by-side baseline).
rate=$(rate_085 $D/cluster)
fastserve bench compare "${common[@]}" --rates "$rate" --out-dir $D/cluster-off > $D/cluster-off.log 2>&1
echo finished >> $D/cluster-off.log
