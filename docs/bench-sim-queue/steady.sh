#!/usr/bin/env bash
# Steady overload, before and after this session's walk and ENST changes, in one sitting:
# N Azure conversations at 3.6 req/s (2x capacity: the queue grows to about N/2), batch 16,
# a 40,000-block store, compiled; BEFORE is a checkout of the commit before them
# (git worktree add /tmp/before 1670227, its generated protos copied in).
# Usage: bash docs/bench-sim-queue/steady.sh [BEFORE_DIR] [N] > docs/bench-sim-queue/steady.txt
source "$(dirname "$0")/before_after.sh" "$@"
for args in "--policies skip-join-mlfq --kv-policies defer" \
            "--policies predictive --kv-policies defer --prediction-sigma 0.75"; do
  for tree in "$before" "$here"; do
    label=$([ "$tree" = "$here" ] && echo after || echo before)
    start=$(date +%s.%N)
    row=$(cd "$tree" && $py -m fastserve.cli sim --trace "$trace" --num-requests "$n" \
          --max-batch-size 16 --store-blocks 40000 --rate 3.6 $args 2>/dev/null | tail -1)
    end=$(date +%s.%N)
    printf '%-6s %6s %-66s %7.1f s  %s\n' "$label" "$n" "$args" "$(echo "$end - $start" | bc)" \
      "$(echo "$row" | awk '{print "JCT", $4, "preempt", $13}')"
  done
done
