#!/usr/bin/env bash
# displace_running_ratio on the real cluster where memory orders the jobs (issue 12): the Azure
# conversation trace's lengths halved (prompts up to 2,000 tokens, token-id prompts run
# to their exact answer length) against a 160-block pool (2,560 tokens), batch 8, the node's
# store, 48 requests arriving at 2 req/s (far past capacity: a burst the cluster drains).
# srpt-oracle (told each length) and predictive at 8 (the default) and 0 (the old behaviour),
# FCFS once for the ratios, then the oracle again in the other order (the spread).
# The runs whose names do not start with "fix" were made on e1f354a, before a job that
# `predictive` has not estimated yet was kept from displacing running jobs; the fixN runs after.
# Usage: bash docs/bench-predictive/displace_running_real/pressure.sh   (repository root; ~25 min)
set -euo pipefail
out=docs/bench-predictive/displace_running_real/pressure
common=(--trace ../shared/traces/AzureLLMInferenceTrace_conv.csv --length-scale 2
        --max-input 2000 --num-requests 48 --kv-blocks 160 --max-batch-size 8 --rates 2
        --seed 1 --fresh-worker --kv-policies proactive --no-progress)
fastserve bench compare --policies fcfs "${common[@]}" --out-dir "$out/fcfs"
for policy in srpt-oracle predictive; do
  for ratio in 8 0; do
    fastserve bench compare --policies "$policy" "${common[@]}" \
      --scheduler-args "--displace-running-ratio $ratio" --out-dir "$out/${policy}_ratio$ratio"
  done
done
for ratio in 0 8; do  # round 2, the other order
  fastserve bench compare --policies srpt-oracle "${common[@]}" \
    --scheduler-args "--displace-running-ratio $ratio" --out-dir "$out/round2_srpt-oracle_ratio$ratio"
done
# Rounds 2 and 3 of predictive, alternated (its first round differed by more than the oracle's).
for run in round2_predictive_ratio0:0 round2_predictive_ratio8:8 round3_predictive_ratio8:8 \
           round3_predictive_ratio0:0 fix1_predictive_ratio8:8 fix1_predictive_ratio0:0 \
           fix2_predictive_ratio8:8 fix2_predictive_ratio0:0 fix3_predictive_ratio0:0 \
           fix3_predictive_ratio8:8 fix4_predictive_ratio8:8 fix4_predictive_ratio0:0; do
  fastserve bench compare --policies predictive "${common[@]}" \
    --scheduler-args "--displace-running-ratio ${run#*:}" --out-dir "$out/${run%:*}"
done
