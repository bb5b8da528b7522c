"""A decode iteration of the engine with the sampler as it is against the sampler as it was at
``--ref`` (a git commit), in one process on one engine, alternated round by round so that a
noisy machine moves both alike: b jobs at a ``--context``-token context, greedy or at
temperature 0.2 / top-p 0.9; each round the median of ``--steps`` decode iterations:

    python docs/bench-sampler/engine_ab.py --ref fe14102 --rounds 8
"""

from __future__ import annotations

import argparse
import pathlib
import sys
import time

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from same_tokens import load_ref


def main() -> int:
    from worker_svc import engine as engine_mod
    from worker_svc.engine import JobCommand, NewJob, StepCommand
    from worker_svc.loader import EngineConfig, load_engine
    from worker_svc.sampler import SamplingParams

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", required=True, help="git commit whose sampler to compare with")
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--batch-sizes", default="1,8")
    args = p.parse_args()
    samplers = {"now": engine_mod.sample, args.ref: load_ref(args.ref).sample}
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    per_job = -(-(args.context + args.steps * args.rounds * 2 + 16) // 16)
    engine = load_engine(EngineConfig("SmolLM2-135M-Instruct", num_blocks=max(sizes) * per_job,
                                      max_context=per_job * 16)).engine
    prompt = [100 + (i % 1000) for i in range(args.context)]
    for b in sizes:
        for mode in ("greedy", "top-p"):
            jobs = list(range(b))
            params = [SamplingParams() if mode == "greedy"
                      else SamplingParams(temperature=0.2, top_p=0.9, seed=j) for j in jobs]
            engine.step(StepCommand(
                new_jobs=[NewJob(j, prompt, params[j],
                                 list(range(j * per_job, (j + 1) * per_job))) for j in jobs],
                commands=[JobCommand(j, args.context) for j in jobs]))
            medians: dict[str, list[float]] = {name: [] for name in samplers}
            for _ in range(args.rounds):
                for name, fn in samplers.items():
                    engine_mod.sample = fn
                    times = []
                    for _ in range(args.steps):
                        t0 = time.perf_counter()
                        engine.step(StepCommand(commands=[JobCommand(j, 1) for j in jobs]))
                        times.append(time.perf_counter() - t0)
                    medians[name].append(float(np.median(times)) * 1e3)
            engine_mod.sample = samplers["now"]
            engine.step(StepCommand(free_job_ids=jobs))
            ratio = np.exp(np.mean(np.log(np.array(medians["now"])
                                          / np.array(medians[args.ref]))))
            print(f"batch {b}, {mode}: " + " | ".join(
                f"{name}: {np.mean(v):.2f} ms (rounds {' '.join(f'{x:.1f}' for x in v)})"
                for name, v in medians.items()) + f" | now / {args.ref}: {ratio:.3f}",
                flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
