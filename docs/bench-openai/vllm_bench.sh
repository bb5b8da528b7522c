#!/usr/bin/env bash
# vLLM's own benchmark client against FastServe's OpenAI API (issue 16), unchanged: run with a
# `fastserve serve` listening on 8000 and vLLM's CPU build in VENV (../shared/INFRA.md):
#   VENV=/tmp/vllm-venv docs/bench-openai/vllm_bench.sh
# One completions run and one chat run, 32 random prompts at once, exact lengths.
set -euo pipefail
VENV=${VENV:-/tmp/vllm-venv}
MODEL=${MODEL:-SmolLM2-135M-Instruct}
TOKENIZER=${TOKENIZER:-$HOME/.cache/fastserve/models/SmolLM2-135M-Instruct}
URL=${URL:-http://127.0.0.1:8000}
here=$(dirname "$0")
for backend in "openai /v1/completions" "openai-chat /v1/chat/completions"; do
  set -- $backend
  "$VENV/bin/python" "$here/vllm_bench.py" --backend "$1" --endpoint "$2" --base-url "$URL" \
    --model "$MODEL" --tokenizer "$TOKENIZER" --dataset-name random --random-input-len 128 \
    --random-output-len 64 --num-prompts 32 --request-rate inf --ignore-eos --seed 0
done
