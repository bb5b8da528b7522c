#!/usr/bin/env bash
# 1.5x FCFS capacity, measured on this machine first (--loads), every run beside FCFS runs:
# `bench compare --rounds 2` (FCFS first, so every other run lies between two of FCFS's).
# Then the proactive KV policy at the same rate. About an hour here.
set -u
source "$(dirname "$0")/common.sh"
fastserve bench compare --policies fcfs,skip-join-mlfq,mlfq,fixed-priority,predictive,srpt-oracle \
  --kv-policies reactive --loads 1.5 "${common[@]}" --out-dir $D/reactive > $D/reactive.log 2>&1
fastserve bench compare --policies fcfs,skip-join-mlfq,mlfq,fixed-priority \
  --kv-policies proactive --rates "$(rate_at 1.5)" "${common[@]}" --out-dir $D/proactive \
  > $D/proactive.log 2>&1
echo finished >> $D/proactive.log
