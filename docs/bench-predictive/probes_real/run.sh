#!/usr/bin/env bash
# Estimates at arrival on the real cluster (issue 12): held-out prompts, natural lengths, batch 8,
# FCFS, `predictive` (probes on: the default) and `predictive` with them off
# (--arrival-probe-tokens 0), the same requests and answers in each run.
#   bursty: Gamma arrivals of CV 4 at 0.8 req/s (run 5's second rate), the default pool;
#   memory: Poisson at 1.2 req/s with 400 KV blocks (1.26x capacity; the overload_kv section).
# Usage: bash docs/bench-predictive/probes_real/run.sh [ROUND [CASES]]   (from the repository
# root; CASES "bursty memory" by default; ~8 min a case)
set -euo pipefail
out=docs/bench-predictive/probes_real
round=${1:-1}
cases=${2:-bursty memory}
prompts=(--prompts docs/bench-predictive/heldout.jsonl --max-tokens 512 --temperature 0.2
         --top-p 0.9 --max-batch-size 8 --fresh-worker)
bursty=(--num-requests 96 --arrivals gamma --cv 4 --rates 0.8 --seed 1)
memory=(--num-requests 64 --kv-blocks 400 --rates 1.2 --seed 2)
for case in $cases; do
  declare -n args=$case
  fastserve bench compare --policies fcfs,predictive "${prompts[@]}" "${args[@]}" \
    --out-dir "$out/${case}_r${round}/on"
  fastserve bench compare --policies predictive "${prompts[@]}" "${args[@]}" \
    --scheduler-args "--arrival-probe-tokens 0" --out-dir "$out/${case}_r${round}/off"
done
