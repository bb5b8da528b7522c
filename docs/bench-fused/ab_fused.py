"""A/B of the fused elementwise kernels in one engine process (docs/benchmarks.md, issue 10).

    python docs/bench-fused/ab_fused.py PROMPT_TOKENS BATCH

Loads the default model once, then alternates six times between the PyTorch path and the
fused kernels (``native.fused_usable`` switched off and on): BATCH prompts of PROMPT_TOKENS
random token ids are prefilled one by one (time per prompt), then 10 decode steps of the whole
batch (time per step). Prints the median of the last five runs of each path.
"""

from __future__ import annotations

import sys
import time

import numpy as np

from worker_svc.engine import JobCommand, NewJob, StepCommand
from worker_svc.loader import EngineConfig, load_engine
from worker_svc.model import native
from worker_svc.sampler import SamplingParams


def main() -> None:
    n_in, batch = int(sys.argv[1]), int(sys.argv[2])
    engine = load_engine(EngineConfig("SmolLM2-135M-Instruct", num_blocks=4096)).engine
    fused_usable = native.fused_usable
    blocks = (n_in + 100) // 16 + 1
    times: dict[str, list[float]] = {k: [] for k in ("torch", "fused", "torch_dec", "fused_dec")}
    job = 0
    for _ in range(6):
        for mode in ("torch", "fused"):
            native.fused_usable = fused_usable if mode == "fused" else (lambda x: False)
            start = time.perf_counter()
            for b in range(batch):
                ids = np.random.default_rng([7, b]).integers(1000, 30000, size=n_in).tolist()
                engine.step(StepCommand(
                    new_jobs=[NewJob(job + b, ids, SamplingParams(),
                                     list(range(blocks * b, blocks * (b + 1))))],
                    commands=[JobCommand(job + b, n_in)]))
            times[mode].append((time.perf_counter() - start) / batch)
            start = time.perf_counter()
            for _ in range(10):
                engine.step(StepCommand(commands=[JobCommand(job + b, 1) for b in range(batch)]))
            times[mode + "_dec"].append((time.perf_counter() - start) / 10)
            engine.step(StepCommand(free_job_ids=[job + b for b in range(batch)]))
            job += batch
    for name, values in times.items():
        print(f"{name:10s} median {np.median(values[1:]) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
