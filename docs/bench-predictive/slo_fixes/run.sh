#!/usr/bin/env bash
# Throughput at the SLO after the last-resort and trimmed-prefill fixes (issue 12): the
# commands of docs/bench-predictive/slo_refresh/ (worker-timed predictions, sigma 0.75),
# without a store and with a 40,000-block store.
# Usage: bash docs/bench-predictive/slo_fixes/run.sh   (from the repository root)
set -euo pipefail
out=docs/bench-predictive/slo_fixes
source docs/bench-predictive/slo_traces.sh
for store in 0 40000; do
  for t in sharegpt azure; do
    for cv in 1 4; do
      name="${t}_cv${cv}_store${store}"
      # shellcheck disable=SC2086
      fastserve sim --trace "${file[$t]}" ${rate[$t]} --num-requests 1000 --arrivals gamma \
        --cv "$cv" --policies fcfs,predictive,srpt-oracle --prediction-sigma 0.75 \
        --prediction-refresh 16 --store-blocks "$store" --slo-search "${grid[$t]}" --refine 2 \
        --json "$out/$name.json" > "$out/$name.txt" 2>/dev/null
      echo "$name: $(grep -A3 'req/s at SLO' "$out/$name.txt" | tail -3 | awk '{print $1, $2}' | tr '\n' ' ')"
    done
  done
done
