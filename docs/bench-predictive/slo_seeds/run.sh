#!/usr/bin/env bash
# Throughput at the SLO on the bursty traces (Gamma CV 4) with the real predictor's error
# (sigma 0.75, worker-timed refresh 16) and a 40,000-block store, seed by seed: the searches of
# displace_running/run.sh use arrival seed 0 and 1,000 requests only. Each line gives every
# policy's rate at the SLO, its ratio to the first policy's, and the highest rate any policy
# could sustain on those requests (`scheduler_svc/sim/bound.py`; * marks a rate above it).
# Usage (repository root): bash docs/bench-predictive/slo_seeds/run.sh [SEEDS] (default 0 1 2 3)
#   POLICIES (default fcfs,predictive), SIGMA (0.75), NUM (requests, 1000), TAG (file names,
#   default sigma$SIGMA, with _n$NUM past 1,000), OUT (this folder).
set -euo pipefail
out=${OUT:-docs/bench-predictive/slo_seeds}
seeds=${1:-0 1 2 3}
policies=${POLICIES:-fcfs,predictive}
sigma=${SIGMA:-0.75}
num=${NUM:-1000}
tag=${TAG:-sigma$sigma}
[ "$num" = 1000 ] || tag="${tag}_n$num"
source docs/bench-predictive/slo_traces.sh
for t in azure sharegpt; do
  for seed in $seeds; do
    name="${t}_cv4_store40000_${tag}_seed${seed}"
    # shellcheck disable=SC2086
    fastserve sim --trace "${file[$t]}" ${rate[$t]} --num-requests "$num" --arrivals gamma \
      --cv 4 --seed "$seed" --policies "$policies" --prediction-sigma "$sigma" \
      --prediction-refresh 16 --arrival-probe-error 0 --store-blocks 40000 \
      --slo-search "${grid[$t]}" --refine 3 --json "$out/$name.json" > "$out/$name.txt" 2>/dev/null
    python3 - "$out/$name.json" "$t seed $seed, $num requests:" <<'PY'
import json, sys
rows = json.load(open(sys.argv[1]))
base = rows[0]["rate_at_slo"]
bound = rows[0]["sustainable_rate_bound"]


def part(r):  # a policy that met the SLO at no rate searched: "-"
    rate = r["rate_at_slo"]
    if rate is None:
        return f"{r['label']} -"
    star = "*" if bound is not None and rate > bound else ""
    ratio = f" ({rate / base:.2f}x)" if base else ""
    return f"{r['label']} {rate:.3f}{star}{ratio}"


tail = (f"| bound {bound:.3f} req/s" + (f", fcfs at {base / bound:.2f} of it" if base else "")
        if bound is not None else "")
print(sys.argv[2], ", ".join(part(r) for r in rows), tail)
PY
  done
done
