"""What a decode iteration of the engine alone costs, by batch size, sampling and predictor.

Two engines of the default model in one process, one without the output-length predictor
and one with it (``predictor="auto"``: the cached artifact), alternated round by round so that
a noisy machine moves both alike; each round the median of ``--steps`` decode iterations of b
jobs whose contexts start at ``--context`` tokens, greedy or at temperature 0.2 / top-p 0.9:

    python docs/bench-predictive/step_parts.py --context 200 --rounds 6
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))


def alternate(variants: dict[str, tuple[Any, Callable[[], None]]], sizes: list[int],
              context: int, steps: int, rounds: int,
              per_job: int) -> Iterator[tuple[str, dict[str, list[float]]]]:
    """For each batch size and mode (greedy, top-p): b jobs prefilled to ``context`` tokens
    on each distinct engine of ``variants`` (name -> engine, and what makes it the one
    measured), then ``rounds`` rounds that time ``steps`` decodes of each variant in turn;
    yields the setting's name and each variant's round medians (ms)."""
    from worker_svc.engine import JobCommand, NewJob, StepCommand
    from worker_svc.sampler import SamplingParams

    engines = list({id(e): e for e, _ in variants.values()}.values())
    prompt = [100 + (i % 1000) for i in range(context)]
    for b in sizes:
        for mode in ("greedy", "top-p"):
            jobs = list(range(b))
            params = [SamplingParams() if mode == "greedy"
                      else SamplingParams(temperature=0.2, top_p=0.9, seed=j) for j in jobs]
            for engine in engines:
                engine.step(StepCommand(
                    new_jobs=[NewJob(j, prompt, params[j],
                                     list(range(j * per_job, (j + 1) * per_job)))
                              for j in jobs],
                    commands=[JobCommand(j, context) for j in jobs]))
            medians: dict[str, list[float]] = {name: [] for name in variants}
            for _ in range(rounds):
                for name, (engine, use) in variants.items():
                    use()
                    times = []
                    for _ in range(steps):
                        t0 = time.perf_counter()
                        engine.step(StepCommand(commands=[JobCommand(j, 1) for j in jobs]))
                        times.append(time.perf_counter() - t0)
                    medians[name].append(float(np.median(times)) * 1e3)
            for engine in engines:
                engine.step(StepCommand(free_job_ids=jobs))
            yield f"batch {b}, {mode}", medians


def line(setting: str, medians: dict[str, list[float]]) -> str:
    return f"{setting}: " + " | ".join(
        f"{name}: {np.mean(v):.2f} ms (rounds {' '.join(f'{x:.1f}' for x in v)})"
        for name, v in medians.items())


def main() -> int:
    from worker_svc.loader import EngineConfig, load_engine

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="SmolLM2-135M-Instruct")
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--batch-sizes", default="1,8")
    args = p.parse_args()
    growth = args.steps * args.rounds + 16
    per_job = -(-(args.context + growth) // 16)
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    variants = {f"predictor {name}": (load_engine(EngineConfig(
        args.model, num_blocks=max(sizes) * per_job, predictor=name,
        max_context=args.context + growth + 16)).engine, lambda: None)
        for name in ("none", "auto")}
    for setting, medians in alternate(variants, sizes, args.context, args.steps, args.rounds,
                                      per_job):
        print(line(setting, medians), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
