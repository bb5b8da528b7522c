"""The batcher's budgets on random job sets: batch size, tokens per iteration, KV blocks, and
blocks that cover every command's tokens."""

from __future__ import annotations

import random

import pytest
from core_driver import BS, LINEAR, count_walked, make_job
from hypothesis import given, settings
from hypothesis import strategies as st

from fastserve.traces import TraceRequest
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import StepResult, TokenResult
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.group import GroupCore
from scheduler_svc.core.kv.allocator import blocks_for
from scheduler_svc.sim import simulate

JOBS = st.lists(st.tuples(st.integers(1, 60), st.integers(1, 8)), min_size=1, max_size=20)


@settings(max_examples=80, deadline=None)
@given(JOBS, st.integers(1, 6), st.integers(1, 64), st.integers(8, 64),
       st.sampled_from(["fcfs", "fixed-priority", "mlfq"]),
       st.sampled_from(["recompute", "defer"]))
def test_every_plan_keeps_its_budgets(jobs, max_batch, max_tokens, num_blocks, policy, kv):
    config = SchedulerConfig(policy=policy, kv_policy=kv, max_batch_size=max_batch,
                             max_batched_tokens=max_tokens)
    core = GroupCore(config, num_blocks, BS, num_blocks * BS, cost_model=LINEAR)
    for i, (prompt, out) in enumerate(jobs):
        if prompt + 1 < num_blocks * BS:
            core.add(make_job(i, prompt_len=prompt, max_tokens=out), 0.0)
    t = 0.0
    for _ in range(2000):
        if not core.has_work():
            break
        plan = core.schedule(t)
        assert plan is not None
        assert len(plan.commands) <= max_batch
        assert plan.num_batched_tokens == sum(c.num_tokens for c in plan.commands) <= max_tokens
        assert len({c.job_id for c in plan.commands}) == len(plan.commands)
        assert core.kv.allocator.num_used <= num_blocks
        results = []
        for c in plan.commands:
            job = core.jobs[c.job_id]
            assert len(job.kv.blocks) >= blocks_for(c.num_computed, BS)
            results.append(TokenResult(c.job_id, c.num_computed, 7 if c.samples else None))
        core.update(plan.step_id, StepResult(results, [], 0.01), t + 0.01)
        core.check_invariants()
        t += 0.01
    assert not core.has_work() and core.kv.num_free == num_blocks


def test_a_long_queue_behind_closed_admission_is_not_walked():
    """FCFS with a KV policy that displaces: once a new job does not fit, the ones behind it
    wait, so the walk stops after the started jobs: its cost does not grow with the queue."""
    config = SchedulerConfig(policy="fcfs", kv_policy="recompute", max_batch_size=64)
    core = GroupCore(config, 16, BS, 64 * BS)
    for i in range(3):
        core.add(make_job(i, prompt_len=15, max_tokens=50), 0.0)  # 4 blocks each
    t = 0.0
    for _ in range(3):
        plan = core.schedule(t)
        results = [TokenResult(c.job_id, c.num_computed, 7 if c.samples else None)
                   for c in plan.commands]
        core.update(plan.step_id, StepResult(results, [], 0.01), t + 0.01)
        t += 0.01
    for i in range(3, 2003):
        core.add(make_job(i, prompt_len=30, max_tokens=5), t)  # 8 blocks: none fits
    consumed = count_walked(core)
    plan = core.schedule(t)
    assert sorted(c.job_id for c in plan.commands) == [0, 1, 2]
    assert consumed[0] <= 3 + 2, f"the walk visited {consumed[0]} jobs of 2,003"


def test_new_jobs_whose_prefill_would_get_no_token_are_passed():
    """A job ranked below 2,000 new jobs that all fit: the first one's prefill takes every
    token of the budget, so the others would get none. They used to be walked one by one,
    each taking a batch slot and promised blocks until the trim dropped it; now they are
    passed (counted, not ranked), and the walk reaches the started job at once."""
    config = SchedulerConfig(policy="srpt-oracle", kv_policy="defer", max_batch_size=64,
                             max_batched_tokens=16)
    core = GroupCore(config, 4096, BS, 4096 * BS)
    core.add(make_job(0, prompt_len=4, max_tokens=1000), 0.0)  # long: ranked last
    plan = core.schedule(0.0)
    core.update(plan.step_id, StepResult([TokenResult(0, 4, 7)], [], 0.01), 0.01)
    for i in range(1, 2001):
        core.add(make_job(i, prompt_len=20, max_tokens=5), 0.01)  # short: ranked first
    walked = [0]
    real_walk = core.policy.walk

    def counting(now, skip):  # type: ignore[no-untyped-def]
        for job in real_walk(now, skip):
            walked[0] += 1
            yield job

    core.policy.walk = counting
    plan = core.schedule(0.02)
    # The started job decodes; the first new job's prefill takes the 15 tokens left.
    assert [(c.job_id, c.num_tokens) for c in plan.commands] == [(1, 15), (0, 1)]
    assert walked[0] <= 3, f"the walk handed out {walked[0]} of 2,001 jobs"


@pytest.mark.parametrize(("seed", "swap_bytes_per_s", "gap_s"),
                         [(0, 1e6, 0.0), (2, 1e6, 0.01), (5, 1e6, 0.0), (15, 1e6, 0.01),
                          (25, 1e8, 0.01)])
@pytest.mark.parametrize("steps_in_flight", [1, 2])
def test_an_upload_does_not_take_the_blocks_promised_to_a_new_job(seed, swap_bytes_per_s,
                                                                   gap_s, steps_in_flight):
    """A paused job's upload took blocks the walk had promised to a higher-priority new job;
    short of them, the new job displaced the upload, which came back in the next Step, for
    ever (seen on a two-stage group: 20,000 swaps and no token). The test suite's cluster
    case in simulation: 20 blocks of 8 tokens, 8 prompts of 30-93 tokens, batch 3, a 16-token
    budget; each of these stalled."""
    rng = random.Random(seed)
    reqs = [TraceRequest(i * gap_s * rng.random(), 30 + 9 * i, 40) for i in range(8)]
    rng.shuffle(reqs)
    reqs.sort(key=lambda r: r.arrival_s)
    cost = CostModel(decode=((1, 0.0143), (64, 0.05)), prefill=((16, 0.011), (128, 0.016)),
                     name="cluster-like", swap_bytes_per_s=swap_bytes_per_s,
                     kv_bytes_per_token=4096)
    config = SchedulerConfig(policy="skip-join-mlfq", kv_policy="proactive", max_batch_size=3,
                             max_batched_tokens=16, starve_limit_s=0.3,
                             steps_in_flight=steps_in_flight)
    result = simulate(reqs, config=config, cost_model=cost, num_blocks=20, block_size=8,
                      store_blocks=4096, check_invariants=True, fast_forward=False)
    assert len(result.records) == 8
    assert all(r.output_tokens == 40 for r in result.records)
