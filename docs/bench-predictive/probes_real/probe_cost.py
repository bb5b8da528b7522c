"""What an arrival probe costs on this machine against the prefill it stands in for (issue 12):
the default model's worker engine, N probes of L tokens in one Step (``StepCommand.probes``)
against the prefill of N prompts of L tokens; best and median of 5 Steps each.

Usage: python docs/bench-predictive/probes_real/probe_cost.py   (from the repository root)
"""

from __future__ import annotations

import random
import time

from fastserve.models import resolve_model
from worker_svc.arrival import ArrivalProbe
from worker_svc.engine import JobCommand, NewJob, StepCommand
from worker_svc.loader import EngineConfig, load_engine

ROUNDS = 5


def timed(run, *args) -> str:
    times = sorted(run(*args, r) for r in range(ROUNDS))
    return f"{times[0] * 1e3:.1f} ms (median {times[ROUNDS // 2] * 1e3:.1f})"


def main() -> None:
    loaded = load_engine(EngineConfig(model=str(resolve_model("default")), num_blocks=512))
    engine = loaded.engine
    print(f"predictor: {loaded.predictor}; answers probes: {engine.arrival_probes}")
    rng = random.Random(0)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(100, 40000) for _ in range(n)]

    def probe_step(n: int, length: int, r: int) -> float:
        cmd = StepCommand(probes=[ArrivalProbe(i, tokens(length), length) for i in range(n)])
        start = time.perf_counter()
        out = engine.step(cmd)
        assert len(out.estimates) == n
        return time.perf_counter() - start

    def prefill_step(n: int, length: int, r: int) -> float:
        per_job = -(-(length + 1) // 16)
        jobs = [NewJob(10_000 + 100 * r + i, tokens(length),
                       block_ids=list(range(i * per_job, (i + 1) * per_job))) for i in range(n)]
        cmd = StepCommand(new_jobs=jobs, commands=[JobCommand(j.job_id, length) for j in jobs])
        start = time.perf_counter()
        out = engine.step(cmd)
        took = time.perf_counter() - start
        assert not out.errors, out.errors[:1]
        engine.step(StepCommand(free_job_ids=[j.job_id for j in jobs]))
        return took

    for n, length in ((1, 60), (4, 60), (8, 60), (1, 128), (8, 128)):
        print(f"{n} probe(s) of {length} tokens: {timed(probe_step, n, length)}")
    for n, length in ((1, 60), (8, 60), (1, 128), (8, 128)):
        print(f"prefill of {n} prompt(s) of {length} tokens: "
              f"{timed(prefill_step, n, length)}")


if __name__ == "__main__":
    main()
