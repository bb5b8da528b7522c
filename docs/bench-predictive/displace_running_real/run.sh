#!/usr/bin/env bash
# displace_running_ratio on the real cluster under memory pressure (issue 12): `predictive`
# under the proactive and reactive KV policies at 0 (paused jobs' blocks only, as before) and
# the default 8; the workload of overload_kv/run.sh (64 held-out prompts, natural lengths, 400
# device blocks, batch 8, the node's store) at 0.6 and 1.2 req/s; FCFS once for the ratios.
# Usage: bash docs/bench-predictive/displace_running_real/run.sh   (from the repository root; ~25 min)
set -euo pipefail
out=docs/bench-predictive/displace_running_real
common=(--max-batch-size 8 --fresh-worker --kv-blocks 400 --prompts docs/bench-predictive/heldout.jsonl
        --num-requests 64 --max-tokens 512 --temperature 0.2 --top-p 0.9 --seed 2 --rates 0.6,1.2)
fastserve bench compare --policies fcfs --kv-policies defer "${common[@]}" --out-dir "$out/fcfs"
for ratio in 8 0; do
  fastserve bench compare --policies predictive --kv-policies proactive,reactive "${common[@]}" \
    --scheduler-args "--displace-running-ratio $ratio" --out-dir "$out/ratio$ratio"
done
# Round 2, the other order, 1.2 req/s and proactive only: the spread between identical plans.
for ratio in 0 8; do
  fastserve bench compare --policies predictive --kv-policies proactive "${common[@]/0.6,1.2/1.2}" \
    --scheduler-args "--displace-running-ratio $ratio" --out-dir "$out/round2_ratio$ratio"
done
