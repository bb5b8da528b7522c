"""Skip-join MLFQ and the baselines: every rule, by example and by property."""

from __future__ import annotations

import itertools

import pytest
from core_driver import LINEAR, iteration_cost, make_core, make_job, run_step
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.policies.mlfq import SkipJoinMLFQ


def mlfq_core(policy="skip-join-mlfq", **kw):
    kw.setdefault("num_blocks", 4096)
    kw.setdefault("max_context", 4096)
    return make_core(cost_model=LINEAR, policy=policy, **kw)


def test_quanta_from_the_profile():
    core = mlfq_core(mlfq_num_queues=5, mlfq_ratio=3.0)
    assert core.policy.quanta == pytest.approx([0.01, 0.03, 0.09, 0.27, 0.81])
    core = mlfq_core(mlfq_q1_quantum_s=0.5)
    assert core.policy.quanta[0] == 0.5


@pytest.mark.parametrize("prompt_len, level", [(1, 0), (5, 1), (20, 2), (31, 2), (32, 3),
                                               (200, 5), (500, 6), (5000, 6)])
def test_skip_join_places_by_predicted_prefill_time(prompt_len, level):
    # Prefill of n tokens: 10 ms + (n-1) ms under LINEAR; quanta 10, 20, 40, 80... ms; a prompt
    # over the 512-token budget is placed by its first chunk.
    core = mlfq_core(max_batched_tokens=512, max_context=8192)
    core.add(make_job(1, prompt_len=prompt_len), 0.0)
    assert core.policy.level[1] == level


def test_naive_mlfq_puts_everyone_in_q1():
    core = mlfq_core(policy="mlfq")
    core.add(make_job(1, prompt_len=900), 0.0)
    assert core.policy.level[1] == 0


def test_demotion_when_service_exceeds_quantum_then_head_return():
    core = mlfq_core(max_batch_size=1)
    core.add(make_job(1, prompt_len=1, max_tokens=50), 0.0)  # Q1 (10 ms)
    core.add(make_job(2, prompt_len=1, max_tokens=50), 0.0)
    plan, _ = run_step(core, 0.0, elapsed=0.008)  # 8 ms <= 10 ms: stays, back at the head
    assert [c.job_id for c in plan.commands] == [1] and core.policy.level[1] == 0
    plan, _ = run_step(core, 0.1, elapsed=0.008)  # 16 ms > 10 ms: demoted to Q2's tail
    assert [c.job_id for c in plan.commands] == [1]
    assert core.policy.level[1] == 1 and core.policy.num_demotions == 1
    plan, _ = run_step(core, 0.2, elapsed=0.008)
    assert [c.job_id for c in plan.commands] == [2]  # job 2 (Q1) now goes first: job 1 preempted
    assert core.stats().num_preemptions >= 1


def test_demotion_skips_queues_too_small_for_the_next_iteration():
    core = mlfq_core(max_batched_tokens=64)
    core.add(make_job(1, prompt_len=200, max_tokens=5), 0.0)  # first chunk 64 tok = 73 ms: Q3
    assert core.policy.level[1] == 3
    run_step(core, 0.0, elapsed=0.2)  # > 80 ms quantum; next chunk still 73 ms -> Q4 (160 ms)
    assert core.policy.level[1] == 4


def test_starving_job_is_promoted_to_q1():
    core = mlfq_core(max_batch_size=1, starve_limit_s=1.0)
    core.add(make_job(1, prompt_len=300, max_tokens=5), 0.0)  # low queue
    t = 0.0
    for i in range(2, 400):  # a stream of short jobs keeps Q1 busy
        core.add(make_job(i, prompt_len=1, max_tokens=3), t)
        run_step(core, t, elapsed=0.01)
        t += 0.01
        if core.policy.num_promotions:
            break
    assert core.policy.num_promotions == 1 and 0.99 < t < 1.1
    assert core.policy.level.get(1) == 0


def test_fixed_priority_runs_shortest_prompt_first():
    core = make_core(policy="fixed-priority", max_batch_size=1, num_blocks=1024)
    for i, n in enumerate([30, 5, 12]):
        core.add(make_job(i, prompt_len=n, max_tokens=1), 0.0)
    order = [run_step(core, t)[0].commands[0].job_id for t in range(3)]
    assert order == [1, 2, 0]


@pytest.mark.parametrize("later, goes_first", [(0.5, True), (0.9, True), (1.1, False),
                                                (3.0, False)])
def test_fixed_priority_ages_a_prompt_by_its_arrival(later, goes_first):
    # Aging 1 s: job 1, half as long as job 0, comes ``later`` s after it, and job 2, half as
    # long again, ``later`` s after job 1. A job goes ahead of an earlier one only if it came
    # within 1 s per halving: all of them or none.
    core = make_core(policy="fixed-priority", max_batch_size=1, num_blocks=1024,
                     priority_aging_s=1.0)
    core.add(make_job(0, prompt_len=40, max_tokens=1, now=0.0), 0.0)
    core.add(make_job(1, prompt_len=20, max_tokens=1, now=later), later)  # half as long
    core.add(make_job(2, prompt_len=10, max_tokens=1, now=2 * later), 2 * later)  # a quarter
    order = [run_step(core, 4.0 + t)[0].commands[0].job_id for t in range(3)]
    assert order == ([2, 1, 0] if goes_first else [0, 1, 2])


def test_fixed_priority_aging_off_is_shortest_prompt_first_whenever_they_came():
    core = make_core(policy="fixed-priority", max_batch_size=1, num_blocks=1024,
                     priority_aging_s=0.0)
    core.add(make_job(0, prompt_len=40, max_tokens=1, now=0.0), 0.0)
    core.add(make_job(1, prompt_len=39, max_tokens=1, now=1e6), 1e6)
    assert run_step(core, 1e6)[0].commands[0].job_id == 1


def test_priority_aging_must_not_be_negative():
    with pytest.raises(ValueError, match="priority_aging_s must be >= 0"):
        SchedulerConfig(priority_aging_s=-1.0)


def test_srpt_oracle_runs_shortest_remaining_output_first():
    core = make_core(policy="srpt-oracle", max_batch_size=1, num_blocks=1024)
    for i, n in enumerate([9, 2, 5]):
        core.add(make_job(i, prompt_len=3, max_tokens=n), 0.0)
    first = [run_step(core, t)[0].commands[0].job_id for t in range(3)]
    assert first == [1, 1, 2]


jobs_strategy = st.lists(
    st.tuples(st.integers(1, 300), st.integers(1, 40), st.floats(0, 2.0)),  # prompt, out, t
    min_size=1, max_size=25,
)


@settings(max_examples=80, deadline=None)
@given(jobs=jobs_strategy, policy=st.sampled_from(["skip-join-mlfq", "mlfq"]),
       batch=st.integers(1, 8), budget=st.integers(16, 256), blocks=st.integers(40, 400),
       starve=st.floats(0.05, 1.0))
def test_every_rule_holds_and_every_job_finishes(jobs, policy, batch, budget, blocks, starve):
    core = make_core(cost_model=LINEAR, policy=policy, max_batch_size=batch,
                     max_batched_tokens=budget, num_blocks=blocks, block_size=4,
                     max_context=blocks * 4, starve_limit_s=starve, watermark=0.0)
    pol: SkipJoinMLFQ = core.policy
    arrivals = sorted(jobs, key=lambda j: j[2])
    arrivals = [(p, o, a) for p, o, a in arrivals if p + o <= blocks * 4 - 1]
    pending = list(enumerate(arrivals))
    t, finished, iterations = 0.0, set(), 0
    while pending or core.has_work():
        while pending and pending[0][1][2] <= t:
            i, (p, o, _) = pending.pop(0)
            job = make_job(i, prompt_len=p, max_tokens=o, now=t)
            core.add(job, t)
            # Skip-join placement: the first queue whose quantum covers the first chunk.
            first = LINEAR.prefill_time(min(p, budget)) if p > 1 else LINEAR.decode_time(1)
            expected = pol.level_for(first) if policy == "skip-join-mlfq" else 0
            assert pol.level[i] == expected
        plan = core.schedule(t)
        # Promotion happens as the batch is formed: outside Q1, nobody has waited past its
        # limit (starve_limit x 2^times promoted), so no job waits more than that plus one
        # iteration.
        for jid in pol.level:
            assert t <= pol.starvation.deadline(jid) or pol.level[jid] == 0
            assert (pol.starvation.deadline(jid) - t
                    <= starve * 2 ** pol.starvation.times_promoted(jid) + 1e-9)
        if plan is None:
            t = pending[0][1][2] if pending else t + 0.01
            continue
        before = {j: (pol.level[j], pol.service[j]) for j in pol.level}
        # Batch budgets.
        assert len(plan.commands) <= batch
        assert plan.num_batched_tokens <= budget
        assert core.kv.allocator.num_used <= blocks
        elapsed = iteration_cost(core, plan)
        in_batch = [core.jobs[c.job_id] for c in plan.commands]
        _, updates = run_step_with(core, plan, t, elapsed)
        t += elapsed
        iterations += 1
        finished |= {u.job.job_id for u in updates if u.finished}
        for job in in_batch:  # demotion thresholds and targets, and head return
            jid = job.job_id
            if jid not in pol.level:
                continue
            lvl, service = before[jid]
            if service + elapsed > pol.quanta[lvl] and lvl < len(pol.quanta) - 1:
                assert pol.level[jid] > lvl
                assert pol.quanta[pol.level[jid]] >= pol.next_iteration_time(job) or \
                    pol.level[jid] == len(pol.quanta) - 1
            else:
                assert pol.level[jid] == lvl
        assert iterations < 20000
    assert finished == set(range(len(arrivals)))
    assert core.kv.allocator.num_free == blocks


def run_step_with(core, plan, now, elapsed):
    """Answer an already-made plan like a worker (see core_driver.run_step)."""
    from scheduler_svc.core.contract import StepResult, TokenResult

    results = []
    for cmd in plan.commands:
        job = core.jobs[cmd.job_id]
        done = cmd.num_computed
        tok = 7 if done == job.num_tokens else None
        results.append(TokenResult(cmd.job_id, done, tok, -0.5 if tok is not None else None))
    updates = core.update(plan.step_id, StepResult(results, [], elapsed), now + elapsed)
    core.check_invariants()
    return plan, updates


@settings(max_examples=40, deadline=None)
@given(jobs=jobs_strategy, batch=st.integers(1, 8), blocks=st.integers(40, 200),
       policy=st.sampled_from(["fcfs", "rtc", "mlfq", "skip-join-mlfq", "fixed-priority",
                               "srpt-oracle"]))
def test_every_policy_finishes_every_job_under_memory_pressure(jobs, batch, blocks, policy):
    core = make_core(cost_model=LINEAR, policy=policy, max_batch_size=batch,
                     max_batched_tokens=64, num_blocks=blocks, block_size=4,
                     max_context=blocks * 4, starve_limit_s=0.2)
    fitting = [(p, o) for p, o, _ in jobs if p + o <= blocks * 4 - 1]
    for i, (p, o) in enumerate(fitting):
        core.add(make_job(i, prompt_len=p, max_tokens=o), 0.0)
    t, done, iterations = 0.0, set(), 0
    while core.has_work():
        plan, updates = run_step(core, t, elapsed=0.02)
        assert plan is not None, "work left but nothing scheduled: deadlock"
        done |= {u.job.job_id for u in updates if u.finished}
        t += 0.02
        iterations += 1
        assert iterations < 20000, "no progress: livelock"
    assert done == set(range(len(fitting))) and core.kv.allocator.num_free == blocks


def test_a_starving_job_waits_twice_as_long_before_each_next_promotion():
    """Under overload every paused job starves; with a fixed limit each would be promoted to
    Q1 (and its KV swapped back in) every starve_limit, round robin over all of them."""
    core = make_core(cost_model=LINEAR, policy="mlfq", starve_limit_s=1.0)
    pol: SkipJoinMLFQ = core.policy
    job = make_job(0, prompt_len=3, max_tokens=100)
    core.add(job, 0.0)
    low = len(pol.quanta) - 1
    t, promoted_at = 0.0, []
    for _ in range(3):
        # Demoted to the lowest queue at t (as after a long run), then never scheduled.
        pol._queues[pol.level[0]].remove(0)
        pol._place(job, low)
        pol._touch(0, t)
        while pol.level[0] != 0:
            t = round(t + 0.01, 2)
            list(pol.order(t))
        promoted_at.append(t)
    waits = [promoted_at[0]] + [b - a for a, b in itertools.pairwise(promoted_at)]
    assert [round(w, 1) for w in waits] == [1.0, 2.0, 4.0]
    assert pol.num_promotions == 3
