#!/usr/bin/env bash
# fixed-priority aged by arrival (priority_aging_s, default 100 s) on the real cluster at 3x
# the capacity run6.sh measured, under reactive (where pure shortest-prompt-first was lowest at
# 1.5x, 0.98x), two rounds with FCFS before and after every run.
# Usage: nohup bash docs/bench-predictive/overload_all/rounds/run7.sh &   (~12 minutes)
set -u
source "$(dirname "$0")/common.sh"
fastserve bench compare --policies fcfs,fixed-priority --kv-policies reactive \
  --rates "$(rate_at 3 3x-recompute-defer)" "${common[@]}" --out-dir $D/3x-fixed-priority-aged \
  > $D/3x-fixed-priority-aged.log 2>&1
echo finished >> $D/3x-fixed-priority-aged.log
