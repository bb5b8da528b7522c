#!/usr/bin/env bash
# `predictive` on the real cluster at run 4's rate (0.85 of this machine's FCFS capacity) with
# the shipped probe (one answer per training prompt) against one trained on four answers per
# prompt (`fastserve predictor train --samples 4`, given as NEW), alternated twice, each on a
# fresh worker, after one FCFS run of the same workload (issue 12). The new probe is put where
# the worker looks first (the model's cache) for its runs and taken away after.
# Usage: bash docs/bench-predictive/probe_samples_real/run.sh NEW.pt   (repository root; ~15 min)
set -euo pipefail
new=$1
out=docs/bench-predictive/probe_samples_real
cached=$(.venv/bin/python -c "from worker_svc.predictor import artifact_path
from fastserve.models import resolve_model
print(artifact_path(resolve_model('SmolLM2-135M-Instruct')))")
[ -e "$cached" ] && { echo "$cached exists: move it away first" >&2; exit 1; }
trap 'rm -f "$cached"' EXIT
run() {  # NAME POLICY
  fastserve --log-level WARNING bench compare --policies "$2" --max-batch-size 8 --fresh-worker \
    --prompts docs/bench-predictive/heldout.jsonl --rate 0.8126 --max-tokens 512 \
    --temperature 0.2 --top-p 0.9 --seed 1 --no-progress --no-plots \
    --out-dir "$out/$1" 2>&1 | grep -E "^$2 " | sed "s/^/$1: /"
}
run fcfs fcfs
for round in 1 2; do
  rm -f "$cached"
  run "shipped-round$round" predictive
  mkdir -p "$(dirname "$cached")" && cp "$new" "$cached"
  run "samples4-round$round" predictive
done
