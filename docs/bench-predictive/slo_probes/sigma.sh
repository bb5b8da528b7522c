#!/usr/bin/env bash
# Throughput at the SLO of `predictive` with estimates at arrival, by prediction error (issue 12:
# sigma 0, 0.5 and 1 beside the real probe's 0.75 of run.sh), worker-timed, no store.
# Usage: bash docs/bench-predictive/slo_probes/sigma.sh   (from the repository root)
set -euo pipefail
out=docs/bench-predictive/slo_probes
source docs/bench-predictive/slo_traces.sh
for t in sharegpt azure; do
  for cv in 1 4; do
    for sigma in 0 0.5 1; do
      name="${t}_cv${cv}_sigma${sigma}"
      # shellcheck disable=SC2086
      fastserve sim --trace "${file[$t]}" ${rate[$t]} --num-requests 1000 --arrivals gamma \
        --cv "$cv" --policies predictive --prediction-sigma "$sigma" --prediction-refresh 16 \
        --slo-search "${grid[$t]}" --refine 2 --json "$out/$name.json" > "$out/$name.txt" 2>/dev/null
      echo "$name: $(grep -A1 'req/s at SLO' "$out/$name.txt" | tail -1 | awk '{print $1, $2}')"
    done
  done
done
