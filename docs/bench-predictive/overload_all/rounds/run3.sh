#!/usr/bin/env bash
# 3x this machine's FCFS capacity (3 x 0.5191 req/s, the capacity run.sh measured), the MLFQs
# under reactive, with the same rounds. About 17 minutes here.
set -u
cd "$(dirname "$0")/../../../.."
export PATH="$PWD/.venv/bin:$PATH"
D=docs/bench-predictive/overload_all/rounds
rate=$(python -c "import json, sys; print(round(3 * json.load(open(sys.argv[1]))['capacity_req_s'], 4))" \
  $D/reactive/capacity.json)
fastserve bench compare --policies fcfs,skip-join-mlfq,mlfq --kv-policies reactive \
  --rates "$rate" --max-batch-size 8 --fresh-worker --kv-blocks 400 \
  --prompts docs/bench-predictive/heldout.jsonl --num-requests 64 --max-tokens 512 \
  --temperature 0.2 --top-p 0.9 --seed 2 --no-progress --rounds 2 \
  --out-dir $D/reactive-3x > $D/reactive-3x.log 2>&1
echo finished >> $D/reactive-3x.log
