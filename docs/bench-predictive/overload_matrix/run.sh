#!/usr/bin/env bash
# Every policy with every KV policy under overload (issue 12, item 1): the Azure conversations
# on the published OPT-13B/A100 model, batch 16, 4,096 blocks, a 40,000-block store, 1,000
# requests at 2.7 and 5.4 req/s (1.5x and 3x FCFS's capacity of about 1.8 req/s), and the
# issue's own command (4,000 requests at 2.5 req/s).
# Usage: bash docs/bench-predictive/overload_matrix/run.sh   (from the repository root)
set -euo pipefail
out=docs/bench-predictive/overload_matrix
trace=../shared/traces/AzureLLMInferenceTrace_conv.csv
for rate in 2.7 5.4; do
  fastserve sim --trace "$trace" --policies fcfs,skip-join-mlfq,mlfq,fixed-priority,srpt-oracle,predictive \
    --prediction-sigma 0.75 --kv-policies proactive,reactive,recompute,defer --store-blocks 40000 \
    --num-requests 1000 --max-batch-size 16 --rate "$rate" 2>/dev/null > "$out/rate$rate.txt"
done
fastserve sim --trace "$trace" --policies fcfs,skip-join-mlfq,predictive,srpt-oracle --prediction-sigma 0.75 \
  --kv-policies proactive --store-blocks 40000 --num-requests 4000 --max-batch-size 16 --rate 2.5 \
  2>/dev/null > "$out/issue_command.txt"
