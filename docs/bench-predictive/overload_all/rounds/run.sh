#!/usr/bin/env bash
# 1.5x FCFS capacity, measured on this machine first (--loads), every run beside FCFS runs:
# `bench compare --rounds 2` (FCFS first, so every other run lies between two of FCFS's).
# Then the proactive KV policy at the same rate. About an hour here.
set -u
cd "$(dirname "$0")/../../../.."
export PATH="$PWD/.venv/bin:$PATH"
D=docs/bench-predictive/overload_all/rounds
common=(--max-batch-size 8 --fresh-worker --kv-blocks 400 --prompts docs/bench-predictive/heldout.jsonl
        --num-requests 64 --max-tokens 512 --temperature 0.2 --top-p 0.9 --seed 2 --no-progress
        --rounds 2)
fastserve bench compare --policies fcfs,skip-join-mlfq,mlfq,fixed-priority,predictive,srpt-oracle \
  --kv-policies reactive --loads 1.5 "${common[@]}" --out-dir $D/reactive > $D/reactive.log 2>&1
rate=$(python -c "import json, sys; print(json.load(open(sys.argv[1]))['loads']['1.5'])" \
  $D/reactive/capacity.json)
fastserve bench compare --policies fcfs,skip-join-mlfq,mlfq,fixed-priority \
  --kv-policies proactive --rates "$rate" "${common[@]}" --out-dir $D/proactive > $D/proactive.log 2>&1
echo finished >> $D/proactive.log
