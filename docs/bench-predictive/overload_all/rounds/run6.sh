#!/usr/bin/env bash
# 3x this machine's FCFS capacity (measured first, --loads 3): the pairs that single runs put
# at or under 0.95x FCFS's tokens/s at 3x (skip-join-mlfq under recompute and defer, predictive
# under recompute), two rounds with FCFS before and after every run.
# Usage: nohup bash docs/bench-predictive/overload_all/rounds/run6.sh &   (~40 minutes)
set -u
source "$(dirname "$0")/common.sh"
fastserve bench compare --policies fcfs,skip-join-mlfq,predictive --kv-policies recompute,defer \
  --loads 3 "${common[@]}" --out-dir $D/3x-recompute-defer > $D/3x-recompute-defer.log 2>&1
echo finished >> $D/3x-recompute-defer.log
