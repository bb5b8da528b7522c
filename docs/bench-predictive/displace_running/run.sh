#!/usr/bin/env bash
# Throughput at the SLO of `predictive` with a 40,000-block store at the default
# displace_running_ratio 8 (a new job it ranks first takes blocks from started jobs below it
# with 8x its work left, during the walk; issue 12): the store half of slo_starve_tokens/run.sh
# (starve_tokens 4), printed beside that run's figure, made before the setting (as 0 is).
# Without a store nothing can be displaced under the proactive KV policy: those cases do not
# change. Usage: bash docs/bench-predictive/displace_running/run.sh   (repository root; ~4 min)
# Again after a change, into another folder and against this run's figures:
#   OUT=docs/bench-predictive/displace_running/estimated BEFORE=docs/bench-predictive/displace_running \
#   BEFORE_SUFFIX= bash docs/bench-predictive/displace_running/run.sh
set -euo pipefail
out=${OUT:-docs/bench-predictive/displace_running}
before=${BEFORE:-docs/bench-predictive/slo_starve_tokens}
suffix=${BEFORE_SUFFIX-_st4}
source docs/bench-predictive/slo_traces.sh
slo() { grep -A3 'req/s at SLO' "$1" | awk -v p="$2" '$1 == p {print $2}'; }
for t in sharegpt azure; do
  for cv in 1 4; do
    for sigma in 0 0.5 0.75 1; do
      name="${t}_cv${cv}_store40000_sigma${sigma}"
      # shellcheck disable=SC2086
      fastserve sim --trace "${file[$t]}" ${rate[$t]} --num-requests 1000 --arrivals gamma \
        --cv "$cv" --policies predictive --prediction-sigma "$sigma" --prediction-refresh 16 \
        --arrival-probe-error 0 --store-blocks 40000 \
        --slo-search "${grid[$t]}" --refine 2 --json "$out/$name.json" > "$out/$name.txt" 2>/dev/null
      echo "$t cv$cv store40000 sigma$sigma:" \
        "fcfs $(slo "docs/bench-predictive/slo_starve_tokens/${name}_st4.txt" fcfs)" \
        "predictive before $(slo "$before/${name}$suffix.txt" predictive) after $(slo "$out/$name.txt" predictive)"
    done
  done
done
