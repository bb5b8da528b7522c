#!/usr/bin/env bash
# The overload matrix of run.sh on all three shared traces: every policy with every KV policy,
# 1,000 requests at 1.5x and 3x FCFS's capacity on each (ShareGPT lengths about 0.87 req/s,
# the code trace 2.6, the conversations 1.8; OPT-13B/A100, batch 16, 4,096 blocks, a
# 40,000-block store). Usage, from the repository root (about 5 minutes):
#   bash docs/bench-predictive/overload_matrix/traces.sh OUT_DIR
#   python docs/bench-predictive/overload_matrix/table.py OUT_DIR
set -euo pipefail
out=$1
mkdir -p "$out"
for run in "sharegpt_lengths_llama2 1.3" "sharegpt_lengths_llama2 2.6" \
           "AzureLLMInferenceTrace_code 3.9" "AzureLLMInferenceTrace_code 7.8" \
           "AzureLLMInferenceTrace_conv 2.7" "AzureLLMInferenceTrace_conv 5.4"; do
  set -- $run
  fastserve sim --trace "../shared/traces/$1.csv" \
    --policies fcfs,skip-join-mlfq,mlfq,fixed-priority,srpt-oracle,predictive \
    --prediction-sigma 0.75 --kv-policies proactive,reactive,recompute,defer \
    --store-blocks 40000 --num-requests 1000 --max-batch-size 16 --rate "$2" \
    --json "$out/$1-$2.json" 2>/dev/null > "$out/$1-$2.txt"
done
