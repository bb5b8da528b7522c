"""Several plans in flight (pipeline depth P): no job in two plans, every result settles the
plan it answers, in any order, unknown step ids refused, and the same tokens as at P = 1.

The worker double applies each plan when it is sent (a worker runs its Steps in order) and
hands the results back late and shuffled; it checks every plan against its own block model.
"""

from __future__ import annotations

import random

import pytest
from core_driver import BS, LINEAR, WorkerModel, make_job

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import StepResult
from scheduler_svc.core.group import GroupCore, UnknownStep


class PositionalWorker(WorkerModel):
    @staticmethod
    def token(job_id: int, position: int) -> int:
        return 3 + (job_id * 31 + position * 7) % 40  # never EOS (2)


def run(depth: int, policy: str, kv_policy: str, seed: int) -> dict[int, list[int]]:
    num_blocks = 48
    config = SchedulerConfig(policy=policy, kv_policy=kv_policy, max_batch_size=4,
                             max_batched_tokens=24, watermark=0.0)
    core = GroupCore(config, num_blocks, BS, num_blocks * BS, cost_model=LINEAR,
                     store_blocks=64, pipeline_depth=depth)
    worker = PositionalWorker(num_blocks)
    rng = random.Random(seed)
    arrivals = sorted((rng.uniform(0, 0.3), i) for i in range(14))
    jobs = {i: make_job(i, prompt_len=rng.randint(1, 30), max_tokens=rng.randint(1, 12), now=t)
            for t, i in arrivals}
    outputs: dict[int, list[int]] = {}
    in_flight: list[tuple[object, list]] = []  # (plan, results), answered out of order
    t, nxt = 0.0, 0
    for _ in range(5000):
        while nxt < len(arrivals) and arrivals[nxt][0] <= t:
            core.add(jobs[arrivals[nxt][1]], t)
            nxt += 1
        while (plan := core.schedule(t)) is not None:
            assert len(in_flight) < depth
            ids = [c.job_id for c in plan.commands]
            busy = {c.job_id for p, _ in in_flight for c in p.commands}
            assert not busy.intersection(ids), "a job is in two plans in flight"
            in_flight.append((plan, worker.apply(plan)))
            core.check_invariants()
        if in_flight:
            plan, results = in_flight.pop(rng.randrange(len(in_flight)))
            for u in core.update(plan.step_id, StepResult(results, [], 0.01), t + 0.01):
                if u.finished:
                    outputs[u.job.job_id] = list(u.job.output)
            core.check_invariants()
        elif nxt == len(arrivals) and not core.has_work():
            break
        t += 0.01
    assert len(outputs) == len(jobs), f"{len(jobs) - len(outputs)} jobs unfinished"
    assert core.kv.num_free == num_blocks and core.kv.store_used == 0
    for i, out in outputs.items():
        assert len(out) == jobs[i].max_tokens
    return outputs


@pytest.mark.parametrize("kv_policy", ["proactive", "reactive", "recompute", "defer"])
@pytest.mark.parametrize("policy", ["fcfs", "skip-join-mlfq"])
def test_deeper_pipelines_give_every_job_the_same_tokens(policy, kv_policy):
    expect = run(1, policy, kv_policy, seed=5)
    for depth in (2, 4):
        for seed in (5, 6):
            got = run(depth, policy, kv_policy, seed)
            if seed == 5:
                assert got == expect, f"P={depth}"


def test_a_result_for_a_step_not_in_flight_is_refused():
    core = GroupCore(SchedulerConfig(), 16, BS, 64, pipeline_depth=2)
    core.add(make_job(1, prompt_len=3, max_tokens=2), 0.0)
    plan = core.schedule(0.0)
    with pytest.raises(UnknownStep, match="step id 99 is not in flight"):
        core.update(99, StepResult(), 0.01)
    core.update(plan.step_id, StepResult(), 0.01)
    with pytest.raises(UnknownStep):  # already settled
        core.update(plan.step_id, StepResult(), 0.02)


def test_no_more_than_the_pipeline_depth_is_handed_out():
    core = GroupCore(SchedulerConfig(max_batch_size=1), 64, BS, 256, pipeline_depth=3)
    for i in range(6):
        core.add(make_job(i, prompt_len=3, max_tokens=5), 0.0)
    plans = []
    while (plan := core.schedule(0.0)) is not None:
        plans.append(plan)
    assert len(plans) == 3 and core.num_in_flight == 3
    assert len({p.step_id for p in plans}) == 3
    assert len({c.job_id for p in plans for c in p.commands}) == 3


@pytest.mark.parametrize(("live", "depth", "sizes"), [(8, 2, [4, 4]), (3, 2, [2, 1]),
                                                      (1, 2, [1]), (20, 2, [8, 8]),
                                                      (8, 1, [8])])
def test_a_pipeline_spreads_the_live_jobs_over_its_batches(live, depth, sizes):
    """Eight jobs under a batch limit of 8 and two stages go as two batches of four, not one
    of eight and an idle stage."""
    core = GroupCore(SchedulerConfig(max_batch_size=8, max_batched_tokens=4096), 256, BS,
                     1024, pipeline_depth=depth)
    for i in range(live):
        core.add(make_job(i, prompt_len=3, max_tokens=5), 0.0)
    plans = []
    while (plan := core.schedule(0.0)) is not None:
        plans.append(plan)
    assert [len(p.commands) for p in plans] == sizes


def test_jobs_waiting_in_the_other_plan_in_flight_are_not_counted_preempted():
    """Two stages, eight jobs in two alternating batches of four for 20 rounds: nobody is
    preempted (each plan leaves out the four the other one holds)."""
    core = GroupCore(SchedulerConfig(max_batch_size=8, max_batched_tokens=4096), 256, BS,
                     1024, pipeline_depth=2)
    worker = PositionalWorker(256)
    for i in range(8):
        core.add(make_job(i, prompt_len=3, max_tokens=30), 0.0)
    in_flight = []
    for r in range(40):
        while (plan := core.schedule(r)) is not None:
            in_flight.append((plan, worker.apply(plan)))
        plan, results = in_flight.pop(0)
        core.update(plan.step_id, StepResult(results, [], 0.01), r + 0.5)
    assert core.num_iterations == 40
    assert core.num_preemptions == 0
