#!/bin/sh
# Instructions `fastserve sim` runs for POLICY over N Azure conversations at 3.6 req/s (twice
# FCFS's capacity; OPT-13B/A100, batch 16, a 40,000-block store, defer), less those of a
# one-request run (the start-up), under valgrind's callgrind: a count that does not vary from
# run to run as wall and CPU time do on these shared machines. TREE is a checkout (a worktree
# of an earlier commit, say) with fastserve/proto built; the compiled core is built for it
# first if need be.
#
#   docs/bench-sim-queue/instructions/instructions.sh TREE POLICY N [fastserve sim options]
set -e
tree=$1 policy=$2 n=$3
shift 3
root=$(cd "$(dirname "$0")/../../.." && pwd)
count() {
  k=$1
  shift
  out=$(mktemp)
  (cd "$tree" && valgrind --tool=callgrind --callgrind-out-file="$out" \
    "$root/.venv/bin/python" -m fastserve.cli sim \
    --trace "$root/../shared/traces/AzureLLMInferenceTrace_conv.csv" --policies "$policy" \
    --kv-policies defer --num-requests "$k" --max-batch-size 16 --rate 3.6 \
    --store-blocks 40000 "$@" 2>&1) | sed -n 's/.*Collected : \([0-9]*\).*/\1/p'
  rm -f "$out"
}
(cd "$tree" && "$root/.venv/bin/python" -m fastserve.cli sim --num-requests 1 \
  --trace "$root/../shared/traces/AzureLLMInferenceTrace_conv.csv" >/dev/null 2>&1)  # build
total=$(count "$n" "$@")
startup=$(count 1 "$@")
echo "$policy $n requests: $(( (total - startup) / 1000000 )) M instructions"
