#!/usr/bin/env bash
# predictive with its key aged by arrival (--predictive-aging 5: a halving of the predicted
# output left is worth 5 s of waiting) on the real cluster: the issue's 0.85-load workload
# (96 held-out prompts, natural lengths, batch 8, a fresh worker per run), FCFS and predictive
# in two rounds, FCFS before and after every run, at 0.85 of the capacity measured first.
# Then the same without the aging at the same rate, right after.
# Usage: bash docs/bench-predictive/aging/run.sh   (~32 minutes here)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../../.."
export PATH="$PWD/.venv/bin:$PATH"
D=docs/bench-predictive/aging
common=(--policies fcfs,predictive --max-batch-size 8 --fresh-worker
        --prompts docs/bench-predictive/heldout.jsonl --max-tokens 512 --temperature 0.2
        --top-p 0.9 --seed 1 --no-progress --rounds 2)
fastserve bench compare "${common[@]}" --loads 0.85 --scheduler-args "--predictive-aging 5" \
  --out-dir $D/cluster > $D/cluster.log 2>&1
echo finished >> $D/cluster.log
# The same at the same rate without the aging, right after (the side-by-side baseline).
rate=$(python -c "import json; print(json.load(open('$D/cluster/capacity.json'))['loads']['0.85'])")
fastserve bench compare "${common[@]}" --rates "$rate" --out-dir $D/cluster-off > $D/cluster-off.log 2>&1
echo finished >> $D/cluster-off.log
