"""Runs of identical decode iterations applied at once (``scheduler_svc/core/steady.py``), and
a walk whose cost does not grow with a queue of new jobs."""

from __future__ import annotations

import random
from dataclasses import dataclass

import pytest
from core_driver import count_walked

import scheduler_svc.core.steady as steady
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import Command, StepPlan
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.group import GroupCore
from scheduler_svc.core.job import Job
from scheduler_svc.core.kv.policies import KV_POLICY_CLASSES
from scheduler_svc.core.policies import POLICIES
from scheduler_svc.core.step_context import StepContext
from scheduler_svc.sim import simulate

COST = CostModel(decode=((1, 0.010), (64, 0.050)), prefill=((1, 0.010), (501, 0.060)),
                 name="test", swap_bytes_per_s=4e9, kv_bytes_per_token=800_000)


@dataclass(frozen=True)
class Req:
    arrival_s: float
    input_tokens: int
    output_tokens: int


def overload(n: int, rate: float, seed: int = 1) -> list[Req]:
    """Long-tailed outputs, short and long prompts, bursts: every mechanism gets exercised
    (preemption, swaps, drops, block boundaries, one-token prompts)."""
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(Req(t, rng.choice([1, 3, rng.randint(1, 300)]),
                       min(int(rng.paretovariate(1.1) * 10), 400)))
        t += rng.expovariate(rate) * (0.1 if rng.random() < 0.2 else 1.0)
    return out


def sim(reqs, policy, kv, fast, steps_in_flight=None, **kw):
    return simulate(reqs, config=SchedulerConfig(policy=policy, kv_policy=kv, max_batch_size=8,
                                                 max_batched_tokens=128,
                                                 steps_in_flight=steps_in_flight),
                    cost_model=COST, num_blocks=160, store_blocks=kw.pop("store_blocks", 400),
                    check_invariants=True,
                    fast_forward=fast, prediction_sigma=0.5 if policy == "predictive" else None,
                    **kw)


@pytest.mark.parametrize("kv", sorted(KV_POLICY_CLASSES))
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_fast_forward_gives_identical_figures(policy, kv, monkeypatch):
    reqs = overload(160, rate=12.0)
    slow = sim(reqs, policy, kv, fast=False)
    windows = []
    real_advance = steady.advance

    def counted(core, starts, iteration_s, token):
        windows.append(len(starts))
        return real_advance(core, starts, iteration_s, token)

    monkeypatch.setattr("scheduler_svc.sim.simulator.advance", counted)
    fast = sim(reqs, policy, kv, fast=True)
    assert fast.records == slow.records
    assert fast.summary() == slow.summary()
    assert fast.num_iterations == slow.num_iterations
    if policy in ("fcfs", "rtc", "fixed-priority", "srpt-oracle", "predictive"):
        # These say how long their order holds: most decode iterations are skipped.
        assert sum(windows) > slow.num_iterations / 3, (len(windows), sum(windows))


@pytest.mark.parametrize("policy", ["skip-join-mlfq", "mlfq"])
def test_the_planner_holds_steady_while_jobs_are_offloaded_and_none_is_due(policy,
                                                                         monkeypatch):
    """With jobs in the store whose ENST is further off than the window (less the upload's
    lead), the proactive planner plans nothing there: windows run with jobs offloaded, and
    the figures are those of planning every iteration. (Under ``predictive`` the offloaded
    jobs ranked just after the batch are due at once, waiting for room: no such window.)"""
    reqs = overload(300, rate=12.0)
    slow = sim(reqs, policy, "proactive", fast=False)
    offloaded_windows = []
    real_advance = steady.advance

    def counted(core, starts, iteration_s, token):
        if core.kv.offloaded:
            offloaded_windows.append(len(starts))
        return real_advance(core, starts, iteration_s, token)

    monkeypatch.setattr("scheduler_svc.sim.simulator.advance", counted)
    fast = sim(reqs, policy, "proactive", fast=True)
    assert fast.records == slow.records and fast.summary() == slow.summary()
    assert slow.num_swap_outs > 0
    assert sum(offloaded_windows) > 0, offloaded_windows


@pytest.mark.parametrize("kv, store", [("defer", 400), ("proactive", 0)])
@pytest.mark.parametrize("policy", ["predictive", "skip-join-mlfq", "srpt-oracle",
                                    "fixed-priority"])
def test_windows_run_past_arrivals_that_every_walk_passes(policy, kv, store, monkeypatch):
    """Where paused KV cannot move (``defer``; the planner with no store) and under overload,
    the device fills with paused KV and arrivals find no room: a plan whose walk passed such
    jobs repeats, and a window goes on past arrivals needing more blocks than the walk's
    floor, where it used to stop at every arrival (no window of a policy whose arrivals
    preempt had any). The figures are those of planning every iteration."""
    reqs = overload(300, rate=12.0)
    slow = sim(reqs, policy, kv, fast=False, store_blocks=store)
    admitted: list[int] = []
    real_advance = steady.advance

    def counted(core, starts, iteration_s, token):
        admitted.append(core.added_since_plan)  # arrivals since its plan: in the window
        return real_advance(core, starts, iteration_s, token)

    monkeypatch.setattr("scheduler_svc.sim.simulator.advance", counted)
    fast = sim(reqs, policy, kv, fast=True, store_blocks=store)
    assert fast.records == slow.records and fast.summary() == slow.summary()
    assert fast.num_iterations == slow.num_iterations
    assert sum(admitted) > 0, admitted


@pytest.mark.parametrize("kv", ["defer", "proactive"])
def test_windows_go_on_through_demotions_that_only_reorder_the_batch(kv, monkeypatch):
    """Under the MLFQ a demotion moves a job to a lower queue's tail; where no job the walk
    reads lies between, the batch is the same in a new order, and the next window goes on in
    it (no plan formed). The figures are those of planning every iteration, and they are
    not if the old order were kept (the stays go back to their queues' heads in the batch's
    order, so the order decides later places)."""
    reqs = overload(300, rate=12.0)
    slow = sim(reqs, "skip-join-mlfq", kv, fast=False)
    reordered = []
    real_reorder = GroupCore.reorder

    def counted(self, batch):
        before = [c.job_id for c in self.repeatable_plan.commands]
        reordered.append(before != [j.job_id for j in batch])
        return real_reorder(self, batch)

    monkeypatch.setattr(GroupCore, "reorder", counted)
    fast = sim(reqs, "skip-join-mlfq", kv, fast=True)
    assert fast.records == slow.records and fast.summary() == slow.summary()
    assert sum(reordered) > 0, reordered


@pytest.mark.parametrize("policy, kv, kw", [
    ("predictive", "defer", {"prediction_refresh": 16}),
    ("predictive", "defer", {"prediction_refresh": 16, "predict_at_arrival": True}),
    ("predictive", "defer", {"prediction_refresh": 16, "arrival_probe_error": 0.3}),
    ("predictive", "defer", {"stop_above_s_per_token": 0.05}),
    ("skip-join-mlfq", "defer", {"stop_above_s_per_token": 0.05}),
    ("predictive", "defer", {"replicas": 2}),
    ("skip-join-mlfq", "defer", {"replicas": 2}),
    ("predictive", "reactive", {"store_blocks": 0}),
])
@pytest.mark.parametrize("rate", [12.0, 30.0])
def test_windows_past_passed_jobs_are_exact_with_the_simulators_options(policy, kv, kw, rate):
    """Refreshed predictions and arrival probes (windows end before a job is predicted at,
    and no arrival is passed while probes are on), a run stopped at the SLO, replicas (no
    arrival passed, no window after a window) and a swapping KV policy with no store."""
    reqs = overload(300, rate=rate)
    slow = sim(reqs, policy, kv, fast=False, **kw)
    fast = sim(reqs, policy, kv, fast=True, **kw)
    assert fast.records == slow.records and fast.summary() == slow.summary()
    assert fast.num_iterations == slow.num_iterations


def test_a_plan_that_passed_jobs_repeats_only_where_no_step_displaces():
    """``steady.repeatable``: passed jobs keep a plan from repeating unless the walk passed
    them by free blocks alone (``StepContext.passes_hold``), and a job read but left out
    always does."""
    plan = StepPlan(commands=[Command(1, 1, [], 10, True), Command(2, 1, [], 20, True)])
    policy = POLICIES["predictive"](SchedulerConfig(policy="predictive"))
    step = StepContext(0.0, plan, policy, 0.01, 2)
    step.rank, step.passed = {1: 0, 2: 1}, 3
    assert not steady.repeatable(plan, step)
    step.passes_hold = True
    assert steady.repeatable(plan, step)
    step.rank[3] = 2  # read, not batched
    assert not steady.repeatable(plan, step)


@pytest.mark.parametrize("kv, holds", [("defer", True), ("recompute", False),
                                       ("reactive", False), ("proactive", False)])
def test_passes_hold_only_where_no_step_can_displace(kv, holds):
    config = SchedulerConfig(policy="predictive", kv_policy=kv, max_batch_size=4)
    core = GroupCore(config, num_blocks=64, block_size=16, max_context=4096,
                     cost_model=COST, store_blocks=256)
    for i in range(3):
        core.add(Job(i, [1] * 100, 50, 0.0, ignore_eos=True, predicted_output_tokens=50), 0.0)
    core.add(Job(3, [1] * 2000, 50, 0.0, ignore_eos=True, predicted_output_tokens=1), 0.0)
    core.schedule(0.0)
    assert core.passes_hold is holds


@pytest.mark.parametrize("policy", ["fcfs", "skip-join-mlfq"])
def test_a_run_stopped_at_the_slo_stops_at_the_same_iteration(policy):
    reqs = overload(200, rate=30.0)
    kw = {"stop_above_s_per_token": 0.05}
    slow = sim(reqs, policy, "proactive", fast=False, **kw)
    fast = sim(reqs, policy, "proactive", fast=True, **kw)
    assert slow.stopped_at_s_per_token is not None
    assert fast.stopped_at_s_per_token == slow.stopped_at_s_per_token
    assert fast.records == slow.records and fast.sim_end_s == slow.sim_end_s


def _walked(num_waiting: int, policy: str = "fcfs") -> int:
    """Jobs the priority walk reads in one schedule() with ``num_waiting`` new jobs queued
    behind a full batch and a prefill that takes the rest of the token budget."""
    config = SchedulerConfig(policy=policy, max_batch_size=8, max_batched_tokens=64,
                             kv_policy="defer")
    core = GroupCore(config, num_blocks=100_000, block_size=16, max_context=4096,
                     cost_model=COST)
    for i in range(4 + num_waiting):
        core.add(Job(i, [1] * 200, 50, 0.0, ignore_eos=True), 0.0)
    seen = count_walked(core)
    plan = core.schedule(0.0)
    assert plan is not None and plan.commands
    return seen[0]


def test_the_walk_ends_once_prefills_take_the_budget_whatever_the_queue():
    # The first job's 200-token prompt takes the 64-token budget: nobody behind it can get a
    # token, and the walk used to read every queued job to find that out.
    assert _walked(10) == _walked(5000) <= 3


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("kv", sorted(KV_POLICY_CLASSES))
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_no_plan_moves_a_job_twice(policy, kv, depth, monkeypatch):
    """A Step offloads or uploads a job at most once: the worker applies all swap-outs before
    the swap-ins, so "offload, upload, offload" of one job in one plan reached it as two
    offloads and failed the job ("already offloaded"); the simulator's ledger crashed on it.
    With two plans in flight (pipeline stages) the proactive planner also offloaded a job the
    same plan's batch had just uploaded (seen on a real two-stage group)."""
    real = GroupCore.schedule
    moves = []

    def checked(self, now):
        plan = real(self, now)
        if plan is not None:
            ids = plan.swap_out + [s.job_id for s in plan.swap_in]
            moves.append(len(ids))
            assert len(ids) == len(set(ids)), (plan.swap_out, plan.swap_in)
        return plan

    monkeypatch.setattr(GroupCore, "schedule", checked)
    for seed in (1, 2, 3):
        sim(overload(200, rate=14.0, seed=seed), policy, kv, fast=True, steps_in_flight=depth)
    if KV_POLICY_CLASSES[kv].swaps and policy in ("skip-join-mlfq", "mlfq", "predictive"):
        assert sum(moves) > 0, "no swaps: the workload put no pressure on the pool"


@pytest.mark.parametrize("depth", [1, 2])
@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_an_upload_runs_before_the_planner_offloads_it_again(policy, depth, monkeypatch):
    """The proactive planner never offloads a job uploaded before it has computed: the round
    trip gains nothing, and with estimates that flip it repeated for ever (one job moved out
    and in on every Step of a two-stage group, never computing). A displacement may (a
    higher-priority job needs the room, and it then runs), and so may the last resort."""
    from scheduler_svc.core.kv.policies import Proactive

    real, real_plan = GroupCore.schedule, Proactive.after_batch
    unrun: set[int] = set()
    planned: set[int] = set()
    seen = []

    def planner(self, step):
        before = set(step.plan.swap_out)
        real_plan(self, step)
        planned.update(set(step.plan.swap_out) - before)

    def checked(self, now):
        planned.clear()
        plan = real(self, now)
        if plan is not None:
            again = unrun.intersection(planned)
            assert not again, f"offloaded again before running: {sorted(again)}"
            unrun.difference_update(c.job_id for c in plan.commands)
            unrun.difference_update(plan.free_job_ids)
            unrun.update(s.job_id for s in plan.swap_in)
            seen.append(len(plan.swap_in))
        return plan

    monkeypatch.setattr(GroupCore, "schedule", checked)
    monkeypatch.setattr(Proactive, "after_batch", planner)
    for seed in (1, 2, 3):
        unrun.clear()
        sim(overload(200, rate=14.0, seed=seed), policy, "proactive", fast=True,
            steps_in_flight=depth)
    if policy in ("skip-join-mlfq", "mlfq", "predictive"):
        assert sum(seen) > 0, "no uploads: the workload put no pressure on the pool"
