#!/usr/bin/env bash
# Wall time of `fastserve sim` for `predictive` before and after its steady_iterations, in one
# sitting: BEFORE is a checkout of the commit before (git worktree add /tmp/before fe4d5ac,
# with its generated protos copied in). Each tree runs its own compiled core (built first).
# Usage: bash docs/bench-predictive/steady/run.sh [BEFORE_DIR] > docs/bench-predictive/steady/times.txt
set -euo pipefail
before=${1:-/tmp/before}
here=$(pwd)
py=$here/.venv/bin/python
trace=$here/../shared/traces/AzureLLMInferenceTrace_conv.csv
n=${N:-2000}
for tree in "$before" "$here"; do  # build each compiled core once, outside the timings
  (cd "$tree" && $py -m fastserve.cli sim --trace "$trace" --policies predictive \
     --num-requests 50 --rate 1 > /dev/null 2>&1)
done
for args in "--kv-policies defer --rate 1.5" "--kv-policies proactive --rate 1.5" \
            "--kv-policies defer --rate 3.6" "--kv-policies proactive --rate 3.6" \
            "--kv-policies defer --rate 3.6 --prediction-sigma 0"; do
  for tree in "$before" "$here"; do
    label=$([ "$tree" = "$here" ] && echo after || echo before)
    sigma=$([[ $args == *sigma* ]] && echo "" || echo "--prediction-sigma 0.75")
    start=$(date +%s.%N)
    row=$(cd "$tree" && $py -m fastserve.cli sim --trace "$trace" --policies predictive \
          --num-requests "$n" --max-batch-size 16 --store-blocks 40000 $sigma $args 2>/dev/null \
          | tail -1)
    end=$(date +%s.%N)
    printf '%-7s %-55s %6.2f s  %s\n' "$label" "$args $sigma" "$(echo "$end - $start" | bc)" \
      "$(echo "$row" | awk '{print "JCT", $4, "preempt", $13}')"
  done
done
