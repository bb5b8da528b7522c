#!/usr/bin/env bash
# Throughput at the SLO with predictions timed as the worker makes them (issue 12):
# the commands of docs/bench-predictive/slo/ (sigma 0.75, default starvation limit) with
# --prediction-refresh 16, with and without --predict-at-arrival, and sigma 0.
# Usage: bash docs/bench-predictive/slo_refresh/run.sh   (from the repository root)
set -euo pipefail
out=docs/bench-predictive/slo_refresh
traces=(sharegpt azure)
declare -A file=([sharegpt]=../shared/traces/sharegpt_lengths_llama2.csv
                 [azure]=../shared/traces/AzureLLMInferenceTrace_conv.csv)
declare -A grid=([sharegpt]=0.25,0.5,0.75,1,1.25,1.5,2,2.5,3,4
                 [azure]=0.5,1,1.5,2,2.5,3,4,5,6,8)
declare -A rate=([sharegpt]="--rate 0.5" [azure]="")
for t in "${traces[@]}"; do
  for cv in 1 4; do
    for v in "s0.75_r16:fcfs,predictive,srpt-oracle:--prediction-sigma 0.75 --prediction-refresh 16" \
             "s0_r16:predictive:--prediction-sigma 0 --prediction-refresh 16" \
             "s0.75_r16_arrival:predictive:--prediction-sigma 0.75 --prediction-refresh 16 --predict-at-arrival"; do
      IFS=: read -r name policies extra <<< "$v"
      # shellcheck disable=SC2086
      fastserve sim --trace "${file[$t]}" ${rate[$t]} --num-requests 1000 --arrivals gamma \
        --cv "$cv" --policies "$policies" $extra --slo-search "${grid[$t]}" --refine 2 \
        --json "$out/${t}_cv${cv}_${name}.json" > "$out/${t}_cv${cv}_${name}.txt" 2>/dev/null
      echo "${t} cv${cv} ${name}: $(tail -n +1 "$out/${t}_cv${cv}_${name}.txt" | grep -A9 'req/s at SLO' | tail -n +2 | awk '{print $1, $2}' | tr '\n' ' ')"
    done
  done
done
