# Sourced by run.sh .. run7.sh: the repository root as the working directory, the venv's
# fastserve, the output folder, the workload of every run (64 held-out prompts, natural
# lengths, 400 device blocks, batch 8, two rounds), and the rate at a load.
cd "$(dirname "${BASH_SOURCE[0]}")/../../../.."
export PATH="$PWD/.venv/bin:$PATH"
D=docs/bench-predictive/overload_all/rounds
common=(--max-batch-size 8 --fresh-worker --kv-blocks 400 --prompts docs/bench-predictive/heldout.jsonl
        --num-requests 64 --max-tokens 512 --temperature 0.2 --top-p 0.9 --seed 2 --no-progress
        --rounds 2)

# rate_at LOAD [RUN]: LOAD x the capacity the --loads command writing $D/RUN measured
# (default reactive, run.sh's), in req/s, rounded as --loads rounds it.
rate_at() {
  python -c "import json, sys; print(round(float(sys.argv[2]) * json.load(open(sys.argv[1]))['capacity_req_s'], 4))" \
    "$D/${2:-reactive}/capacity.json" "$1"
}
