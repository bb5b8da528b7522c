"""The bound on the rate any policy sustains (``scheduler_svc/sim/bound.py``): no simulated
run beats it, whatever the policy, KV policy or pool, and it is near what FCFS does when the
batch or the pool is what limits it."""

from __future__ import annotations

import dataclasses
import random

import pytest

from fastserve.traces import TraceRequest as Req
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import PUBLISHED, CostModel
from scheduler_svc.sim import simulate, sustainable_rate

# decode 10 ms at batch 1 and 50 ms at 64; prefill 10 ms + 0.1 ms a token (test_simulator's).
COST = CostModel(decode=((1, 0.010), (64, 0.050)), prefill=((1, 0.010), (501, 0.060)),
                 name="test")


def queued(n: int, seed: int, max_in: int = 300, max_out: int = 120) -> list[Req]:
    """``n`` requests all queued at 0 (so a run's makespan is the time to serve them)."""
    rng = random.Random(seed)
    return [Req(0.0, rng.randint(1, max_in), min(int(rng.paretovariate(1.1) * 6), max_out))
            for _ in range(n)]


@pytest.mark.parametrize("policy,kv_policy,store", [
    ("fcfs", "proactive", 0), ("predictive", "proactive", 4000), ("srpt-oracle", "reactive", 4000),
    ("skip-join-mlfq", "proactive", 4000), ("predictive", "recompute", 0), ("rtc", "defer", 0),
])
@pytest.mark.parametrize("num_blocks,max_batch", [(40, 16), (400, 8), (120, 64)])
def test_no_run_serves_the_requests_faster_than_the_bound(policy, kv_policy, store,
                                                          num_blocks, max_batch):
    reqs = queued(120, seed=num_blocks + max_batch)
    config = SchedulerConfig(policy=policy, kv_policy=kv_policy, max_batch_size=max_batch,
                             max_batched_tokens=128)
    res = simulate(reqs, config=config, cost_model=COST, num_blocks=num_blocks,
                   store_blocks=store, prediction_sigma=0.5, check_invariants=True)
    bound = sustainable_rate(reqs, cost_model=COST, num_blocks=num_blocks,
                             max_batch_size=max_batch, max_batched_tokens=128)
    assert bound is not None and bound.requests == len(res.records) == 120
    assert res.sim_end_s >= bound.least_s
    assert res.num_iterations >= bound.iterations


def test_the_bound_is_near_fcfs_where_the_batch_or_the_pool_binds():
    # Equal jobs: FCFS keeps the batch full (a large pool): the bound is within 2% of its
    # makespan. With a small pool it is looser (it counts no prompt's blocks during its
    # prefill, no reserve kept free, no recomputation) but still within 25%.
    reqs = [Req(0.0, 64, 64) for _ in range(256)]
    for num_blocks, binds, near in ((4096, "batch", 0.98), (64, "pool", 0.75),
                                    (128, "pool", 0.75)):
        res = simulate(reqs, config=SchedulerConfig(max_batch_size=32), cost_model=COST,
                       num_blocks=num_blocks)
        bound = sustainable_rate(reqs, cost_model=COST, num_blocks=num_blocks, max_batch_size=32)
        assert bound is not None and bound.binds == binds
        assert near * res.sim_end_s <= bound.least_s <= res.sim_end_s
        assert bound.rate == pytest.approx(256 / bound.least_s)


def test_the_bound_fits_the_requests_to_the_context_and_scales_with_replicas():
    reqs = [Req(0.0, 5000, 10), Req(0.0, 100, 10_000), Req(0.0, 100, 50)]
    one = sustainable_rate(reqs, cost_model=COST, num_blocks=64)  # 1,024 tokens
    assert one is not None and one.requests == 2  # the 5,000-token prompt cannot run at all
    clipped = sustainable_rate([Req(0.0, 100, 924), Req(0.0, 100, 50)], cost_model=COST,
                               num_blocks=64)
    assert clipped is not None and clipped.least_s == pytest.approx(one.least_s)
    two = sustainable_rate(reqs, cost_model=COST, num_blocks=64, replicas=2)
    assert two is not None and two.rate == pytest.approx(2 * one.rate)
    assert sustainable_rate([], cost_model=COST, num_blocks=64) is None
    piped = PUBLISHED["opt-66b-a100"].split(1, 4)
    assert sustainable_rate(reqs, cost_model=piped, num_blocks=64) is None


def test_a_cost_model_with_a_small_fixed_cost_still_gives_a_bound():
    # f < a + b: the time then falls with the iterations, so the bound takes their most.
    cheap = dataclasses.replace(COST, decode=((1, 0.0001), (2, 0.01)),
                                prefill=((1, 0.0001), (2, 0.01)))
    reqs = queued(30, seed=3)
    res = simulate(reqs, config=SchedulerConfig(max_batch_size=8), cost_model=cheap,
                   num_blocks=400)
    bound = sustainable_rate(reqs, cost_model=cheap, num_blocks=400, max_batch_size=8)
    assert bound is not None and 0 < bound.least_s <= res.sim_end_s
