#!/usr/bin/env bash
# The pairs the rounds had not covered under the KV policies that drop or keep KV: FCFS,
# fixed-priority, predictive and the oracle under recompute and defer, two rounds with FCFS
# before and after every run, at 1.5x the capacity this machine measures first (--loads 1.5).
# Usage: nohup bash docs/bench-predictive/overload_all/rounds/run4.sh &   (~45 minutes)
set -u
source "$(dirname "$0")/common.sh"
fastserve bench compare --policies fcfs,fixed-priority,predictive,srpt-oracle \
  --kv-policies recompute,defer --loads 1.5 "${common[@]}" --out-dir $D/ranked-recompute-defer \
  > $D/ranked-recompute-defer.log 2>&1
echo finished >> $D/ranked-recompute-defer.log
