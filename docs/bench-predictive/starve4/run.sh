cd /work/main
for lim in 3 30 3 30; do
  .venv/bin/fastserve --log-level WARNING bench compare --policies predictive --max-batch-size 8 --fresh-worker \
    --prompts docs/bench-predictive/heldout.jsonl --rate 0.8126 --max-tokens 512 --temperature 0.2 --top-p 0.9 \
    --seed 1 --no-progress --no-plots --scheduler-args "--starve-limit $lim" --out-dir docs/bench-predictive/starve4/limit$lim-$RANDOM 2>&1 | grep -E "^predictive " | sed "s/^/limit $lim: /"
done
echo starve-done
