#!/usr/bin/env bash
# The MLFQs, which preempt the most, under recompute and defer at the rate of run.sh (1.5x
# this machine's FCFS capacity), with the same rounds. About 30 minutes here.
set -u
source "$(dirname "$0")/common.sh"
fastserve bench compare --policies fcfs,skip-join-mlfq,mlfq --kv-policies recompute,defer \
  --rates "$(rate_at 1.5)" "${common[@]}" --out-dir $D/recompute-defer > $D/recompute-defer.log 2>&1
echo finished >> $D/recompute-defer.log
