"""A minimal stand-in for the scheduler, for driving an Engine directly in tests.

It allocates blocks from a shuffled free list (so block tables are never contiguous), appends
blocks as jobs grow, admits jobs at given iterations, splits prefills into chunks, and frees a
job in the iteration after it finishes. ``drive_swapping`` does the same with a device pool too
small for all jobs: it offloads every job outside the next two batches, in every Step.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

import torch

from worker_svc.engine import Engine, JobCommand, NewJob, StepCommand, SwapIn
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
        _record(out, batch)
        if max_batch is not None:
            active = active[1:] + active[:1]  # rotate: every job gets paused now and then
        _retire(active, to_free, free)
        it += 1
    assert engine.pool.num_used_blocks == 0 and not engine.jobs
    return {j.job_id: j.output for j in jobs}


def _record(out, batch: list[DriverJob]) -> None:
    """Apply a Step's results to the driver's jobs: computed tokens and sampled tokens."""
    by_id = {j.job_id: j for j in batch}
    for r in out.results:
        job = by_id[r.job_id]
        job.computed = r.num_computed_tokens
        if r.token_id is not None:
            job.output.append(r.token_id)


def _retire(active: list[DriverJob], to_free: list[int], free: list[int]) -> None:
    """Done jobs leave ``active``; they are freed in the next Step and their blocks reused."""
    for job in [j for j in active if j.done]:
        active.remove(job)
        to_free.append(job.job_id)
        free.extend(job.blocks)


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


@dataclass
class SwapTally:
    """What ``drive_swapping`` saw: swaps issued and the engine's swap stats, summed."""

    swap_outs: dict[int, int] = field(default_factory=dict)  # job id -> SwapOuts sent
    swap_ins: dict[int, int] = field(default_factory=dict)
    reactive: int = 0  # SwapIns sent in the same Step as the job's command
    proactive: int = 0  # SwapIns sent one Step ahead
    blocks_out: int = 0
    blocks_in: int = 0
    hidden: int = 0
    waited: int = 0
    wait_s: float = 0.0


def drive_swapping(engine: Engine, jobs: list[DriverJob], max_batch: int,
                   chunk: int | None = None, reactive_every: int = 3,
                   seed: int = 0) -> tuple[dict[int, list[int]], SwapTally]:
    """Run ``jobs`` to completion round-robin, ``max_batch`` at a time, keeping on the device
    only the jobs of this iteration's batch and (proactively) of the next one.

    Every other job is offloaded in each Step. The next batch's offloaded jobs are swapped in
    one Step ahead, except in every ``reactive_every``-th iteration, whose next batch is then
    swapped in in the same Step as its commands. Blocks come from a LIFO free list, so blocks
    a SwapOut releases are handed to other jobs (SwapIn targets, appends) in the same Step.
    """
    rng = random.Random(seed)
    free = list(range(engine.pool.num_blocks))
    rng.shuffle(free)
    bs = engine.pool.block_size
    tally = SwapTally()
    waiting = sorted(jobs, key=lambda j: j.arrival)
    active: list[DriverJob] = []
    offloaded: set[int] = set()
    registered: set[int] = set()
    to_free: list[int] = []
    it = 0

    def take(n: int) -> list[int]:
        assert len(free) >= n, f"driver: pool of {engine.pool.num_blocks} blocks too small"
        return [free.pop() for _ in range(n)]

    while waiting or active or to_free:
        cmd = StepCommand(free_job_ids=to_free)
        to_free = []
        while waiting and waiting[0].arrival <= it:
            active.append(waiting.pop(0))
        batch = active[:max_batch]
        upcoming = active[max_batch:2 * max_batch] if it % reactive_every else []
        keep = {j.job_id for j in batch + upcoming}
        for job in active:
            if job.job_id not in keep and job.job_id not in offloaded and job.blocks:
                cmd.swap_out.append(job.job_id)
                tally.swap_outs[job.job_id] = tally.swap_outs.get(job.job_id, 0) + 1
                offloaded.add(job.job_id)
                free.extend(job.blocks)
                job.blocks = []
        for job in batch + upcoming:
            if job.job_id in offloaded:
                job.blocks = take(math.ceil(job.computed / bs))
                cmd.swap_in.append(SwapIn(job.job_id, list(job.blocks)))
                tally.swap_ins[job.job_id] = tally.swap_ins.get(job.job_id, 0) + 1
                offloaded.discard(job.job_id)
                if job in batch:
                    tally.reactive += 1
                else:
                    tally.proactive += 1
        for job in batch:
            if job.job_id not in registered:
                cmd.new_jobs.append(NewJob(job.job_id, job.prompt, job.sampling, []))
                registered.add(job.job_id)
            known = len(job.prompt) + len(job.output)
            n = known - job.computed
            if chunk is not None:
                n = min(n, chunk)
            new_blocks = take(max(math.ceil((job.computed + n) / bs) - len(job.blocks), 0))
            job.blocks.extend(new_blocks)
            cmd.commands.append(JobCommand(job.job_id, n, new_blocks))
        out = engine.step(cmd)
        assert not out.errors, out.errors
        s = out.swap
        tally.blocks_out += s.num_blocks_out
        tally.blocks_in += s.num_blocks_in
        tally.hidden += s.num_swap_ins_hidden
        tally.waited += s.num_swap_ins_waited
        tally.wait_s += out.swap_wait_s
        _record(out, batch)
        active = active[max_batch:] + active[:max_batch]
        _retire(active, to_free, free)
        it += 1
    assert engine.swap.wait_idle()
    # collects the stats of copies that ended after the last Step
    final = engine.step(StepCommand())
    tally.blocks_out += final.swap.num_blocks_out
    tally.blocks_in += final.swap.num_blocks_in
    assert engine.pool.num_used_blocks == 0 and not engine.jobs
    assert engine.swap.num_offloaded_jobs == 0
    return {j.job_id: j.output for j in jobs}, tally
