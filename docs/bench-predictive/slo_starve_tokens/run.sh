#!/usr/bin/env bash
# Throughput at the SLO of `predictive` by its starvation limit's size scaling (issue 12):
# starve_tokens 16 (the old constant) against 4 (the default now), worker-timed predictions
# with estimates at arrival, by prediction sigma, on both traces, Gamma CV 1 and 4, without a
# store and with a 40,000-block store. Prints one line per case; FCFS in the default's run.
# Usage: bash docs/bench-predictive/slo_starve_tokens/run.sh   (from the repository root; ~10 min)
set -euo pipefail
out=docs/bench-predictive/slo_starve_tokens
source docs/bench-predictive/slo_traces.sh
slo() { grep -A3 'req/s at SLO' "$1" | awk -v p="$2" '$1 == p {print $2}'; }
for store in 0 40000; do
  for t in sharegpt azure; do
    for cv in 1 4; do
      for sigma in 0 0.5 0.75 1; do
        line="$t cv$cv store$store sigma$sigma:"
        for st in 16 4; do
          name="${t}_cv${cv}_store${store}_sigma${sigma}_st${st}"
          policies=predictive
          [ "$st" = 4 ] && policies=fcfs,predictive
          # shellcheck disable=SC2086
          fastserve sim --trace "${file[$t]}" ${rate[$t]} --num-requests 1000 --arrivals gamma \
            --cv "$cv" --policies "$policies" --prediction-sigma "$sigma" --prediction-refresh 16 \
            --arrival-probe-error 0 --set "starve_tokens=$st" --store-blocks "$store" \
            --slo-search "${grid[$t]}" --refine 2 --json "$out/$name.json" > "$out/$name.txt" 2>/dev/null
          line="$line st$st $(slo "$out/$name.txt" predictive)"
          [ "$st" = 4 ] && line="$line fcfs $(slo "$out/$name.txt" fcfs)"
        done
        echo "$line"
      done
    done
  done
done
