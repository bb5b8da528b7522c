#!/usr/bin/env bash
# Every policy with every KV policy on the real cluster at 1.5x and 3x FCFS's capacity (issue
# 12, "Overload, simulated and on the real cluster"): the workload of overload_kv/run.sh (64
# held-out prompts, natural lengths, 400 device blocks, batch 8, the node's store). FCFS first,
# which measures the capacity (--loads) and runs at both loads; then the other five policies
# under the four KV policies at the rates it chose (srpt-oracle told the answers' lengths by
# the first run at each rate). Usage, from the repository root (about 45 minutes here a load):
#   bash docs/bench-predictive/overload_all/run.sh [OUT_DIR] [LOADS]     # LOADS: 1.5,3
set -euo pipefail
out=${1:-docs/bench-predictive/overload_all}
loads=${2:-1.5,3}
common=(--max-batch-size 8 --fresh-worker --kv-blocks 400 --prompts docs/bench-predictive/heldout.jsonl
        --num-requests 64 --max-tokens 512 --temperature 0.2 --top-p 0.9 --seed 2)
fastserve bench compare --policies fcfs --kv-policies defer --loads "$loads" "${common[@]}" \
  --out-dir "$out/fcfs"
rates=$(python -c "import json, sys; print(','.join(map(str, json.load(open(sys.argv[1]))['loads'].values())))" \
  "$out/fcfs/capacity.json")
fastserve bench compare --policies skip-join-mlfq,mlfq,fixed-priority,predictive,srpt-oracle \
  --kv-policies proactive,reactive,recompute,defer --rates "$rates" "${common[@]}" \
  --out-dir "$out/preemptive"
