#!/usr/bin/env bash
# Wall time of `fastserve sim` (compiled core, loading and summing up included) before and
# after this session's simulator changes (predictive's steady_iterations, the starvation clock's
# heap), in one sitting: BEFORE is a checkout of the commit before them
# (git worktree add /tmp/before fe4d5ac, its generated protos copied in); each tree runs its
# own compiled core, built first outside the timings. Azure conversations, batch 16, 4,096
# blocks, a 40,000-block store, OPT-13B/A100; the figures (JCT, preemptions) must match.
# Usage: bash docs/bench-predictive/steady/run.sh [BEFORE_DIR] > docs/bench-predictive/steady/times.txt
set -euo pipefail
before=${1:-/tmp/before}
here=$(pwd)
py=$here/.venv/bin/python
trace=$here/../shared/traces/AzureLLMInferenceTrace_conv.csv
for tree in "$before" "$here"; do
  (cd "$tree" && $py -m fastserve.cli sim --trace "$trace" --policies predictive \
     --num-requests 50 --rate 1 > /dev/null 2>&1)
done
while read -r n args; do
  for tree in "$before" "$here"; do
    label=$([ "$tree" = "$here" ] && echo after || echo before)
    start=$(date +%s.%N)
    row=$(cd "$tree" && $py -m fastserve.cli sim --trace "$trace" --num-requests "$n" \
          --max-batch-size 16 --store-blocks 40000 $args 2>/dev/null | tail -1)
    end=$(date +%s.%N)
    printf '%-6s %5s %-80s %6.2f s  %s\n' "$label" "$n" "$args" "$(echo "$end - $start" | bc)" \
      "$(echo "$row" | awk '{print "JCT", $4, "preempt", $13}')"
  done
done <<'CASES'
4000 --policies predictive --kv-policies defer --rate 1.5 --prediction-sigma 0.75
4000 --policies predictive --kv-policies proactive --rate 1.5 --prediction-sigma 0.75
8000 --policies predictive --kv-policies defer --rate 3.6 --prediction-sigma 0
4000 --policies predictive --kv-policies defer --rate 3.6 --prediction-sigma 0.75
4000 --policies predictive --kv-policies proactive --rate 3.6 --prediction-sigma 0.75
4000 --policies skip-join-mlfq --kv-policies proactive --rate 3.6
4000 --policies skip-join-mlfq --kv-policies defer --rate 3.6
CASES
