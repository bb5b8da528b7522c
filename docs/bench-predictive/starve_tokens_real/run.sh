#!/usr/bin/env bash
# `predictive` on the real cluster at run 4's rate (0.85 of this machine's FCFS capacity),
# starve_tokens 16 (the old constant) against 4 (the default now), alternated twice, each on a
# fresh worker, after one FCFS run of the same workload (issue 12).
# Usage: bash docs/bench-predictive/starve_tokens_real/run.sh   (from the repository root; ~17 min)
set -euo pipefail
out=docs/bench-predictive/starve_tokens_real
run() {  # NAME POLICY SCHEDULER_ARGS
  fastserve --log-level WARNING bench compare --policies "$2" --max-batch-size 8 --fresh-worker \
    --prompts docs/bench-predictive/heldout.jsonl --rate 0.8126 --max-tokens 512 \
    --temperature 0.2 --top-p 0.9 --seed 1 --no-progress --no-plots --scheduler-args "$3" \
    --out-dir "$out/$1" 2>&1 | grep -E "^$2 " | sed "s/^/$1: /"
}
run fcfs fcfs ""
for round in 1 2; do
  run "tokens16-round$round" predictive "--starve-tokens 16"
  run "tokens4-round$round" predictive ""
done
