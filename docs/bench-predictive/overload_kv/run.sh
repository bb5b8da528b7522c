#!/usr/bin/env bash
# The real cluster under memory pressure with the KV policies not covered before (issue 12,
# item 1): FCFS once (it never preempts), skip-join-mlfq and predictive under reactive,
# recompute and defer; 64 held-out prompts, 400 device blocks, batch 8, the node's store.
# Usage: bash docs/bench-predictive/overload_kv/run.sh   (from the repository root; ~45 min)
set -euo pipefail
out=docs/bench-predictive/overload_kv
common=(--max-batch-size 8 --fresh-worker --kv-blocks 400 --prompts docs/bench-predictive/heldout.jsonl
        --num-requests 64 --max-tokens 512 --temperature 0.2 --top-p 0.9 --seed 2)
for rates in 0.6,1.2 2.85; do
  tag=$([ "$rates" = 2.85 ] && echo _3x || echo "")
  fastserve bench compare --policies fcfs --kv-policies defer --rates "$rates" "${common[@]}" \
    --out-dir "$out/fcfs$tag"
  fastserve bench compare --policies skip-join-mlfq,predictive --kv-policies reactive,recompute,defer \
    --rates "$rates" "${common[@]}" --out-dir "$out/preemptive$tag"
done
