#!/usr/bin/env bash
# Throughput at the SLO with estimates at arrival (issue 12): the commands of
# docs/bench-predictive/slo_fixes/ (worker-timed predictions, sigma 0.75; without a store and
# with a 40,000-block store), where `predictive` now also gets an estimate of each waiting job
# from its prompt's last 128 tokens (the default arrival_probe_tokens), as good as its first
# token's (--arrival-probe-error 0) or worse by exp(N(0, 0.5)) and exp(N(0, 0.75)) when the
# tail is shorter than the prompt; and with the probes off (--set arrival_probe_tokens=0).
# Usage: bash docs/bench-predictive/slo_probes/run.sh   (from the repository root; ~30 min)
set -euo pipefail
out=docs/bench-predictive/slo_probes
source docs/bench-predictive/slo_traces.sh
for store in 0 40000; do
  for t in sharegpt azure; do
    for cv in 1 4; do
      for v in "e0:fcfs,predictive:--arrival-probe-error 0" \
               "e0.5:predictive:--arrival-probe-error 0.5" \
               "e0.75:predictive:--arrival-probe-error 0.75" \
               "off:predictive:--set arrival_probe_tokens=0"; do
        IFS=: read -r tag policies extra <<< "$v"
        name="${t}_cv${cv}_store${store}_${tag}"
        # shellcheck disable=SC2086
        fastserve sim --trace "${file[$t]}" ${rate[$t]} --num-requests 1000 --arrivals gamma \
          --cv "$cv" --policies "$policies" --prediction-sigma 0.75 --prediction-refresh 16 \
          $extra --store-blocks "$store" --slo-search "${grid[$t]}" --refine 2 \
          --json "$out/$name.json" > "$out/$name.txt" 2>/dev/null
        echo "$name: $(grep -A2 'req/s at SLO' "$out/$name.txt" | tail -n +2 | awk '{print $1, $2}' | tr '\n' ' ')"
      done
    done
  done
done
