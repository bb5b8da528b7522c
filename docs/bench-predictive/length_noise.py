"""How much of an answer's length can any predictor read from the prompt? (issue 12)

At the serving settings (temperature 0.2, top-p 0.9, cap 512) the same prompt gives answers
of different lengths from one seed to the next: the part of the length that no predictor
reading the prompt can know. This generates every held-out prompt's answer with several
seeds on an in-process engine (as ``fastserve predictor train`` does) and prints:

- between seeds: the Spearman correlation of two seeds' lengths, and ``sigma_n``, the spread
  of one answer's log length around its prompt's expected log length
  (``SD(log L_a - log L_b) / sqrt(2)``): the lognormal error of a perfect predictor of the
  expected length, the floor under any predictor's error from the prompt;
- the best from the prompt: each seed's lengths predicted by the mean log length of the other
  seeds (Spearman, and the log error's spread, less the part the finite mean adds);
- the shipped probe's first estimates (``--run``: a ``bench compare`` JSON of these prompts,
  whose requests carry ``predicted_output_tokens``) against every seed's lengths, and against
  the run's own.

Usage (from the repository root; ~3 minutes per seed on 2 cores):
    python docs/bench-predictive/length_noise.py --seeds 4 \
        --run docs/bench-predictive/run4/predictive_rate0.8126.json \
        --json docs/bench-predictive/length_noise/lengths.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys


def log_sd(a: list[float], b: list[float]) -> float:
    """Spread of log(a / b) over the pairs."""
    return statistics.pstdev(math.log(x / y) for x, y in zip(a, b))


def generate(prompts_file: str, seeds: int, max_tokens: int, batch_size: int
             ) -> list[list[int]]:
    from fastserve.bench.prompts import load_instructions
    from fastserve.predictor.collect import chat_engine, collect
    from worker_svc.sampler import SamplingParams

    loaded, prompts, eos = chat_engine("SmolLM2-135M-Instruct", load_instructions(prompts_file),
                                       max_tokens=max_tokens, batch_size=batch_size)
    out = []
    for s in range(seeds):
        print(f"seed {s + 1} of {seeds}", file=sys.stderr)
        sampling = [SamplingParams(0.2, 0.9, 0, 7_000_003 * (s + 1) + i)
                    for i in range(len(prompts))]
        _, lengths = collect(loaded.engine, prompts, eos=eos, max_tokens=max_tokens,
                             sampling=sampling, batch_size=batch_size, layers=(), refresh=16)
        out.append(lengths)
    return out


def report(lengths: list[list[int]], run: dict | None) -> dict:
    from fastserve.predictor.rank import spearman

    k = len(lengths)
    pairs = list(itertools.combinations(range(k), 2))
    between_rho = statistics.mean(spearman(lengths[a], lengths[b]) for a, b in pairs)
    sigma_n = statistics.mean(log_sd(lengths[a], lengths[b]) for a, b in pairs) / math.sqrt(2)
    logs = [[math.log(x) for x in seed] for seed in lengths]
    best_rho, best_sd = [], []
    for s in range(k):
        others = [statistics.mean(logs[o][i] for o in range(k) if o != s)
                  for i in range(len(lengths[s]))]
        best_rho.append(spearman(others, logs[s]))
        raw = statistics.pstdev(o - x for o, x in zip(others, logs[s]))
        # The mean of k-1 samples carries sigma_n^2 / (k-1) of noise of its own.
        best_sd.append(math.sqrt(max(raw ** 2 - sigma_n ** 2 / (k - 1), 0.0)))
    out = {"prompts": len(lengths[0]), "seeds": k,
           "at_cap": [sum(x >= 512 for x in seed) for seed in lengths],
           "between_seeds": {"spearman": round(between_rho, 3), "sigma_n": round(sigma_n, 3)},
           "best_from_prompt": {"spearman": round(statistics.mean(best_rho), 3),
                                "log_error_sigma": round(statistics.mean(best_sd), 3)}}
    if run is not None:
        import numpy as np

        # The run sent request i with prompt order[i] (``fastserve/bench/prompts.py``).
        n = len(lengths[0])
        order = np.random.default_rng(run["config"]["seed"]).permutation(n).tolist()
        pred, own = [0.0] * n, [0] * n
        for r in run["requests"]:
            pred[order[r["index"]]] = r["predicted_output_tokens"]
            own[order[r["index"]]] = r["output_tokens"]
        out["probe"] = {
            "vs_seeds_spearman": round(statistics.mean(spearman(pred, s) for s in lengths), 3),
            "vs_seeds_log_error_sigma": round(statistics.mean(log_sd(pred, s)
                                                              for s in lengths), 3),
            "vs_run_spearman": round(spearman(pred, own), 3),
            "vs_run_log_error_sigma": round(log_sd(pred, own), 3),
            "run_vs_seeds_spearman": round(statistics.mean(spearman(own, s)
                                                           for s in lengths), 3)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", default="docs/bench-predictive/heldout.jsonl")
    p.add_argument("--seeds", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--run", default=None, help="a bench compare JSON of the same prompts")
    p.add_argument("--json", default=None, help="lengths are kept here and reused")
    args = p.parse_args()
    lengths = None
    if args.json:
        try:
            with open(args.json) as f:
                lengths = json.load(f)["lengths"]
        except FileNotFoundError:
            pass
    if lengths is None:
        lengths = generate(args.prompts, args.seeds, args.max_tokens, args.batch_size)
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"lengths": lengths}, f)
    run = None
    if args.run:
        with open(args.run) as f:
            run = json.load(f)
    print(json.dumps(report(lengths, run), indent=2))


if __name__ == "__main__":
    main()
