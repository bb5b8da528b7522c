# Sourced by the real-cluster comparisons at the issue's 0.85 load (aging/run.sh,
# loops/run.sh): the repository root as the working directory, the venv's fastserve, the
# workload (96 held-out prompts, natural lengths, batch 8, a fresh worker per run, FCFS and
# predictive) in ``common``, and ``rate_085 DIR``: 0.85 of the capacity the --loads command
# writing DIR measured, in req/s, as --loads rounds it.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
export PATH="$PWD/.venv/bin:$PATH"
common=(--policies fcfs,predictive --max-batch-size 8 --fresh-worker
        --prompts docs/bench-predictive/heldout.jsonl --max-tokens 512 --temperature 0.2
        --top-p 0.9 --seed 1 --no-progress)

rate_085() {
  python -c "import json; print(json.load(open('$1/capacity.json'))['loads']['0.85'])"
}
