"""The growth reserve (``SchedulerConfig.kv_growth_reserve``): under a policy whose arrivals
preempt, while paused jobs' KV has nowhere to go, a new job starts only if it leaves free
``kv_growth_reserve`` blocks per job holding KV, so that started jobs can grow instead of
being recomputed by the last resort."""

from __future__ import annotations

import random

from core_driver import LINEAR, make_core, make_job, run_step

from fastserve.traces import TraceRequest
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.sim import simulate


def _two_holders(policy="skip-join-mlfq", **overrides):
    """A core under defer (skip-join by default: arrivals preempt), 20 blocks of 4 tokens, two
    started jobs holding 2 blocks each."""
    core = make_core(num_blocks=20, cost_model=LINEAR, policy=policy, kv_policy="defer",
                     max_batch_size=4, **overrides)
    for jid in (0, 1):
        core.add(make_job(jid, prompt_len=5, max_tokens=60), 0.0)
    run_step(core, 0.0)
    assert len(core.kv.holding) == 2 and core.kv.num_free == 16
    return core


def test_a_new_job_starts_only_if_it_leaves_room_for_the_started_ones_to_grow():
    # A 47-token prompt needs 12 blocks (with its first token): 4 would be left, under the
    # 3 x 2 = 6 the two holders keep for growth, so it waits; one of 39 tokens (10 blocks)
    # leaves 6 and starts.
    core = _two_holders()
    core.add(make_job(2, prompt_len=47, max_tokens=10), 0.1)
    plan, _ = run_step(core, 0.1)
    assert 2 not in {c.job_id for c in plan.commands}
    core.add(make_job(3, prompt_len=39, max_tokens=10), 0.2)
    plan, _ = run_step(core, 0.2)
    assert 3 in {c.job_id for c in plan.commands}


def test_without_it_or_under_fcfs_only_the_watermark_holds_a_new_job_back():
    for core in (_two_holders(kv_growth_reserve=0),
                 _two_holders(policy="fcfs")):  # FCFS's arrivals never preempt
        core.add(make_job(2, prompt_len=47, max_tokens=10), 0.1)
        plan, _ = run_step(core, 0.1)
        assert 2 in {c.job_id for c in plan.commands}


def test_the_reserve_keeps_a_preemptive_policy_from_recomputing_in_a_tight_pool():
    """Long answers arriving faster than they finish in a pool that cannot hold a full batch of
    them, no store: the last resort drops started jobs' KV over and over without the reserve."""
    rng = random.Random(3)
    reqs, t = [], 0.0
    for _ in range(60):
        t += rng.expovariate(4.0)
        reqs.append(TraceRequest(t, rng.randint(16, 48), rng.randint(100, 300)))
    runs = {}
    for reserve in (0, 3):
        config = SchedulerConfig(policy="skip-join-mlfq", kv_policy="defer", max_batch_size=8,
                                 kv_growth_reserve=reserve)
        runs[reserve] = simulate(reqs, config=config, cost_model=LINEAR, num_blocks=100,
                                 block_size=16, check_invariants=True)
    assert runs[0].num_recomputes > 2 * max(runs[3].num_recomputes, 1)
    assert runs[3].summary()["throughput_tokens_s"] >= runs[0].summary()["throughput_tokens_s"]
