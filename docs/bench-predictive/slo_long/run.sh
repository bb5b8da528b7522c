#!/usr/bin/env bash
# The grid of throughput at the SLO (ShareGPT and the Azure conversations, Gamma CV 1
# and 4, `predictive` at prediction sigma 0, 0.5, 0.75 (the real probe's) and 1, beside FCFS
# and the SRPT oracle; OPT-13B/A100, 4,096 blocks, batch 64, a 40,000-block store, predictions
# timed as the worker makes them), on traces of 4,000 requests instead of 1,000: at 1,000 a
# policy that serves short jobs first meets the SLO at rates no policy sustains (the run ends
# before its queue breaks the mean; docs/benchmarks.md, "Throughput at the SLO is bounded by
# capacity"). Every search prints the bound of scheduler_svc/sim/bound.py beside it.
# Usage (repository root; ~40 min on one core): bash docs/bench-predictive/slo_long/run.sh
#   NUM (requests, 4000), SEED (arrival seed, 0), OUT (this folder); the table after:
#   python docs/bench-predictive/slo_long/table.py docs/bench-predictive/slo_long
set -euo pipefail
out=${OUT:-docs/bench-predictive/slo_long}
num=${NUM:-4000}
seed=${SEED:-0}
declare -A file=([sharegpt]=../shared/traces/sharegpt_lengths_llama2.csv
                 [azure]=../shared/traces/AzureLLMInferenceTrace_conv.csv)
declare -A grid=([sharegpt]=0.25,0.5,0.75,1,1.25 [azure]=0.5,1,1.5,2,2.5,3,3.5)
declare -A rate=([sharegpt]="--rate 0.5" [azure]="")
search() {  # NAME POLICIES SIGMA TRACE CV
  # shellcheck disable=SC2086
  fastserve sim --trace "${file[$4]}" ${rate[$4]} --num-requests "$num" --arrivals gamma \
    --cv "$5" --seed "$seed" --policies "$2" --prediction-sigma "$3" --prediction-refresh 16 \
    --arrival-probe-error 0 --store-blocks 40000 --slo-search "${grid[$4]}" --refine 3 \
    --json "$out/$1.json" > "$out/$1.txt" 2>/dev/null
  echo "$1 done"
}
for t in azure sharegpt; do
  for cv in 4 1; do
    search "${t}_cv${cv}_base" fcfs,srpt-oracle 0 "$t" "$cv"
    for sigma in 0 0.5 0.75 1; do
      search "${t}_cv${cv}_sigma${sigma}" predictive "$sigma" "$t" "$cv"
    done
  done
done
