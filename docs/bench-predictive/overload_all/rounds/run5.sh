#!/usr/bin/env bash
# The last pairs of the 1.5x matrix the rounds had not covered: predictive and the oracle under
# proactive, two rounds with FCFS before and after every run, at run4.sh's rate (1.5x the
# capacity it measured on the same machine).
# Usage: nohup bash docs/bench-predictive/overload_all/rounds/run5.sh [OUT] &   (~14 minutes)
set -u
source "$(dirname "$0")/common.sh"
# OUT (default ranked-proactive): run it again into another folder for two more rounds.
out=${1:-ranked-proactive}
fastserve bench compare --policies fcfs,predictive,srpt-oracle --kv-policies proactive \
  --rates "$(rate_at 1.5 ranked-recompute-defer)" "${common[@]}" --out-dir $D/$out > $D/$out.log 2>&1
echo finished >> $D/$out.log
