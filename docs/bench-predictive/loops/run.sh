#!/usr/bin/env bash
# The loop check on the real cluster: the issue's 0.85-load workload (96 held-out prompts,
# natural lengths, batch 8, a fresh worker per run), `fcfs,predictive` with the worker's loop
# check on (--loop-ngram 32, the default) and off (0), alternated twice; the rate is 0.85 of
# the capacity the first command measures. Each command's own FCFS run is the reference.
# Usage: bash docs/bench-predictive/loops/run.sh   (~27 minutes on 2 cores)
source "$(dirname "${BASH_SOURCE[0]}")/../heldout_085.sh"
D=docs/bench-predictive/loops
fastserve bench compare "${common[@]}" --loads 0.85 --out-dir $D/on1 > $D/on1.log 2>&1
rate=$(rate_085 $D/on1)
echo "rate $rate req/s"
fastserve bench compare "${common[@]}" --rates "$rate" --loop-ngram 0 --out-dir $D/off1 > $D/off1.log 2>&1
fastserve bench compare "${common[@]}" --rates "$rate" --out-dir $D/on2 > $D/on2.log 2>&1
fastserve bench compare "${common[@]}" --rates "$rate" --loop-ngram 0 --out-dir $D/off2 > $D/off2.log 2>&1
echo done
