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
from collections.abc import Callable

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "bench-predictive"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from same_tokens import load_ref
from step_parts import alternate, line


def main() -> int:
    from worker_svc import engine as engine_mod
    from worker_svc.loader import EngineConfig, load_engine

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", required=True, help="git commit whose sampler to compare with")
    p.add_argument("--context", type=int, default=200)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--batch-sizes", default="1,8")
    args = p.parse_args()
    sizes = [int(b) for b in args.batch_sizes.split(",")]
    per_job = -(-(args.context + args.steps * args.rounds * 2 + 16) // 16)
    engine = load_engine(EngineConfig("SmolLM2-135M-Instruct", num_blocks=max(sizes) * per_job,
                                      max_context=per_job * 16)).engine
    samplers = {"now": engine_mod.sample, args.ref: load_ref(args.ref).sample}

    def use(fn: Callable) -> Callable[[], None]:
        return lambda: setattr(engine_mod, "sample", fn)

    variants = {name: (engine, use(fn)) for name, fn in samplers.items()}
    for setting, medians in alternate(variants, sizes, args.context, args.steps, args.rounds,
                                      per_job):
        ratio = np.exp(np.mean(np.log(np.array(medians["now"]) / np.array(medians[args.ref]))))
        print(f"{line(setting, medians)} | now / {args.ref}: {ratio:.3f}", flush=True)
    engine_mod.sample = samplers["now"]
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
