"""Engine iterations of the default model: a 436-token prefill alone, the same prefill with 7
decodes in the batch, and the 7 decodes alone (median of the last 5 of 6 runs, in ms).

    python docs/bench-fused/mixed_iteration.py
"""

from __future__ import annotations

import time

import numpy as np

from worker_svc.engine import JobCommand, NewJob, StepCommand
from worker_svc.loader import EngineConfig, load_engine
from worker_svc.sampler import SamplingParams

PROMPT = 436


def main() -> None:
    engine = load_engine(EngineConfig("SmolLM2-135M-Instruct", num_blocks=4096)).engine
    blocks = (PROMPT + 200) // 16 + 1

    def ids(seed: int) -> list[int]:
        return np.random.default_rng([7, seed]).integers(1000, 30000, size=PROMPT).tolist()

    def table(slot: int) -> list[int]:
        return list(range(blocks * slot, blocks * (slot + 1)))

    engine.step(StepCommand(
        new_jobs=[NewJob(b, ids(b), SamplingParams(), table(b)) for b in range(7)],
        commands=[JobCommand(b, PROMPT) for b in range(7)]))
    job = 100
    times: dict[str, list[float]] = {"prefill": [], "mixed": [], "decode7": []}
    for _ in range(6):
        for mode, values in times.items():
            new, commands = [], []
            if mode != "decode7":
                new = [NewJob(job, ids(job), SamplingParams(), table(8))]
                commands = [JobCommand(job, PROMPT)]
            if mode != "prefill":
                commands += [JobCommand(b, 1) for b in range(7)]
            start = time.perf_counter()
            engine.step(StepCommand(new_jobs=new, commands=commands))
            values.append(time.perf_counter() - start)
            if new:
                engine.step(StepCommand(free_job_ids=[job]))
                job += 1
    for mode, values in times.items():
        print(f"{mode:8s} {np.median(values[1:]) * 1e3:.1f} ms")


if __name__ == "__main__":
    main()
