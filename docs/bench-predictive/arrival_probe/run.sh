#!/usr/bin/env bash
# What an estimate made at arrival from the prompt's last K tokens would be worth (issue 12):
# sim.patch (an experiment, not part of FastServe) charges each arrival min(K, prompt) x 0.73
# prompt tokens of prefill in the next iteration (the probe reads layer 22 of 30) and, with
# --predict-at-arrival, multiplies that first estimate by exp(N(0, ARR_EXTRA_SIGMA)) for a tail
# that ranks worse than the whole prompt. PROBE_K=100000: a probe pass over the whole prompt.
# Usage: bash docs/bench-predictive/arrival_probe/run.sh   (from the repository root)
set -euo pipefail
root=$(pwd)
out=$root/docs/bench-predictive/arrival_probe
tree=$(mktemp -d)/fastserve
git worktree add -q --detach "$tree" HEAD
trap 'git -C "$root" worktree remove --force "$tree"' EXIT
git -C "$tree" apply "$out/sim.patch"
cd "$tree"
declare -A file=([sharegpt]=$root/../shared/traces/sharegpt_lengths_llama2.csv
                 [azure]=$root/../shared/traces/AzureLLMInferenceTrace_conv.csv)
declare -A grid=([sharegpt]=0.25,0.5,0.75,1,1.25,1.5,2 [azure]=0.5,1,1.5,2,2.5,3,4,5,6,8)
declare -A rate=([sharegpt]="--rate 0.5" [azure]="")
for store in 0 40000; do
  for t in sharegpt azure; do
    for v in "0 0" "128 0" "128 0.5" "128 0.75" "100000 0"; do
      read -r k extra <<< "$v"
      # shellcheck disable=SC2086
      PROBE_K=$k ARR_EXTRA_SIGMA=$extra python -m fastserve.cli sim --trace "${file[$t]}" \
        ${rate[$t]} --num-requests 1000 --arrivals gamma --cv 4 --policies predictive \
        --prediction-sigma 0.75 --prediction-refresh 16 --predict-at-arrival \
        --store-blocks "$store" --slo-search "${grid[$t]}" --refine 2 2>/dev/null \
        | tail -1 | sed "s/^/$t K=$k extra=$extra /"
    done
    # shellcheck disable=SC2086
    python -m fastserve.cli sim --trace "${file[$t]}" ${rate[$t]} --num-requests 1000 \
      --arrivals gamma --cv 4 --policies fcfs,predictive,srpt-oracle --prediction-sigma 0.75 \
      --prediction-refresh 16 --store-blocks "$store" --slo-search "${grid[$t]}" --refine 2 \
      2>/dev/null | tail -3 | sed "s/^/$t base /"
  done > "$out/store$store.txt"
done
