#!/usr/bin/env bash
# Windows past the jobs every walk passes, and one after another (the MLFQ's reorderings),
# before and after, in one sitting: N Azure
# conversations at 3.6 req/s (2x capacity: the queue grows to about N/2), OPT-13B/A100,
# batch 16, compiled (each tree's build made first, outside the timings). BEFORE is a
# checkout of the commit before the change (git worktree add /tmp/before 7ce8f47, its
# generated protos copied in).
# Usage: bash docs/bench-sim-queue/passing/run.sh [BEFORE_DIR] [N] > docs/bench-sim-queue/passing/run.txt
source "$(dirname "$0")/../before_after.sh" "$@"
for tree in "$before" "$here"; do  # the compiled builds, untimed
  (cd "$tree" && $py -m fastserve.cli sim --trace "$trace" --num-requests 50 --rate 3.6 \
     --policies fcfs >/dev/null 2>&1)
done
for args in "--policies skip-join-mlfq --kv-policies defer --store-blocks 40000" \
            "--policies predictive --kv-policies defer --store-blocks 40000 --prediction-sigma 0.75" \
            "--policies predictive --prediction-sigma 0.75" \
            "--policies srpt-oracle --kv-policies defer --store-blocks 40000" \
            "--policies fixed-priority --kv-policies defer --store-blocks 40000"; do
  for tree in "$before" "$here"; do
    label=$([ "$tree" = "$here" ] && echo after || echo before)
    start=$(date +%s.%N)
    row=$(cd "$tree" && $py -m fastserve.cli sim --trace "$trace" --num-requests "$n" \
          --max-batch-size 16 --rate 3.6 $args 2>/dev/null | tail -1)
    end=$(date +%s.%N)
    printf '%-6s %6s %-82s %6.1f s  %s\n' "$label" "$n" "$args" "$(echo "$end - $start" | bc)" \
      "$(echo "$row" | awk '{print "JCT", $4, "preempt", $13}')"
  done
done
