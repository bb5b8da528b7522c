#!/usr/bin/env bash
# 3x this machine's FCFS capacity (3 x 0.5191 req/s, the capacity run.sh measured), the MLFQs
# under reactive, with the same rounds. About 17 minutes here.
set -u
source "$(dirname "$0")/common.sh"
fastserve bench compare --policies fcfs,skip-join-mlfq,mlfq --kv-policies reactive \
  --rates "$(rate_at 3)" "${common[@]}" --out-dir $D/reactive-3x > $D/reactive-3x.log 2>&1
echo finished >> $D/reactive-3x.log
