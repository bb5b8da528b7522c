#!/usr/bin/env bash
# The MLFQs, which preempt the most, under recompute and defer at the rate of run.sh (1.5x
# this machine's FCFS capacity), with the same rounds. About 30 minutes here.
set -u
cd "$(dirname "$0")/../../../.."
export PATH="$PWD/.venv/bin:$PATH"
D=docs/bench-predictive/overload_all/rounds
rate=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['loads']['1.5'])" \
  $D/reactive/capacity.json)
fastserve bench compare --policies fcfs,skip-join-mlfq,mlfq --kv-policies recompute,defer \
  --rates "$rate" --max-batch-size 8 --fresh-worker --kv-blocks 400 \
  --prompts docs/bench-predictive/heldout.jsonl --num-requests 64 --max-tokens 512 \
  --temperature 0.2 --top-p 0.9 --seed 2 --no-progress --rounds 2 \
  --out-dir $D/recompute-defer > $D/recompute-defer.log 2>&1
echo finished >> $D/recompute-defer.log
