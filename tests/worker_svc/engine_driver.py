"""A minimal stand-in for the scheduler, for driving an Engine directly in tests.

It allocates blocks from a shuffled free list (so block tables are never contiguous), appends
blocks as jobs grow, admits jobs at given iterations, splits prefills into chunks, and frees a
job in the iteration after it finishes.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch

from worker_svc.engine import Engine, JobCommand, NewJob, StepCommand
from worker_svc.sampler import SamplingParams


@dataclass
class DriverJob:
    job_id: int
    prompt: list[int]
    max_tokens: int
    arrival: int = 0  # iteration at which it joins
    sampling: SamplingParams = field(default_factory=SamplingParams)
    output: list[int] = field(default_factory=list)
    computed: int = 0
    blocks: list[int] = field(default_factory=list)

    @property
    def done(self) -> bool:
        return len(self.output) >= self.max_tokens


def drive(engine: Engine, jobs: list[DriverJob], chunk: int | None = None, seed: int = 0,
          max_batch: int | None = None) -> dict[int, list[int]]:
    """Run ``jobs`` to completion; return each job's generated tokens by id."""
    rng = random.Random(seed)
    free = list(range(engine.pool.num_blocks))
    rng.shuffle(free)
    bs = engine.pool.block_size
    waiting = sorted(jobs, key=lambda j: j.arrival)
    active: list[DriverJob] = []
    to_free: list[int] = []
    it = 0
    while waiting or active or to_free:
        cmd = StepCommand(free_job_ids=to_free)
        to_free = []
        while waiting and waiting[0].arrival <= it:
            job = waiting.pop(0)
            cmd.new_jobs.append(NewJob(job.job_id, job.prompt, job.sampling, []))
            active.append(job)
        batch = active if max_batch is None else active[:max_batch]
        for job in batch:
            known = len(job.prompt) + len(job.output)
            n = known - job.computed
            if chunk is not None:
                n = min(n, chunk)
            need = math.ceil((job.computed + n) / bs) - len(job.blocks)
            new_blocks = [free.pop() for _ in range(max(need, 0))]
            job.blocks.extend(new_blocks)
            cmd.commands.append(JobCommand(job.job_id, n, new_blocks))
        out = engine.step(cmd)
        assert not out.errors, out.errors
        by_id = {j.job_id: j for j in batch}
        for r in out.results:
            job = by_id[r.job_id]
            job.computed = r.num_computed_tokens
            if r.token_id is not None:
                job.output.append(r.token_id)
        if max_batch is not None:
            active = active[1:] + active[:1]  # rotate: every job gets paused now and then
        for job in [j for j in active if j.done]:
            active.remove(job)
            to_free.append(job.job_id)
            free.extend(job.blocks)
        it += 1
    assert engine.pool.num_used_blocks == 0 and not engine.jobs
    return {j.job_id: j.output for j in jobs}


@dataclass
class Reference:
    tokens: list[int]
    logits: list[torch.Tensor]  # one [vocab] row per generated token


def hf_greedy(model, prompt: list[int], max_tokens: int) -> Reference:
    """transformers generate(), greedy, one prompt alone, exactly ``max_tokens`` tokens."""
    with torch.inference_mode():
        out = model.generate(
            torch.tensor([prompt]), attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
            max_new_tokens=max_tokens, min_new_tokens=max_tokens, do_sample=False,
            output_logits=True, return_dict_in_generate=True, pad_token_id=0,
        )
    return Reference(out.sequences[0, len(prompt):].tolist(), [x[0] for x in out.logits])


NEAR_TIE = 1e-4


def assert_matches(got: list[int], ref: Reference, what: str) -> None:
    """Token-identical to the reference, except after a float32 near-tie in the reference.

    A divergence is accepted only where the reference's top-2 logits at that step are within
    NEAR_TIE and our token is one of those two; everything after it is then incomparable.
    """
    assert len(got) == len(ref.tokens), f"{what}: {len(got)} tokens, expected {len(ref.tokens)}"
    for i, (a, b) in enumerate(zip(got, ref.tokens)):
        if a == b:
            continue
        top = torch.topk(ref.logits[i].float(), 2)
        gap = (top.values[0] - top.values[1]).item()
        assert gap < NEAR_TIE and a in top.indices.tolist(), (
            f"{what}: diverges at generated token {i}: got {a}, reference {b} "
            f"(reference top-2 gap {gap:.2e}); got {got}, reference {ref.tokens}"
        )
        return
