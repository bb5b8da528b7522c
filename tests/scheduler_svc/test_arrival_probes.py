"""Estimates at arrival (``SchedulerConfig.arrival_probe_tokens``): the core asks the worker for
an estimate of each job that waits for room, from its prompt's last tokens, and `predictive`
ranks the waiting jobs by it before their prefill."""

from __future__ import annotations

import math

import pytest
from core_driver import LINEAR, make_core, make_job, run_step

from fastserve.traces import TraceRequest
from scheduler_svc import wire
from scheduler_svc.core.contract import ArrivalProbe, StepPlan, StepResult, TokenResult
from scheduler_svc.sim import simulate


def _answer(core, plan, now, estimates, check=True):
    """A worker's answer: token 7 for every job that samples, and ``estimates`` (job id ->
    predicted output tokens) for the plan's probes."""
    results = [TokenResult(c.job_id, c.num_computed,
                           7 if c.num_computed == core.jobs[c.job_id].num_tokens else None)
               for c in plan.commands]
    est = [(p.job_id, estimates[p.job_id]) for p in plan.probes]
    core.update(plan.step_id, StepResult(results, [], 0.01, estimates=est), now + 0.01)
    if check:
        core.check_invariants()


def _busy_core(num_blocks=5, **overrides):
    """A predictive core with one batch slot, job 0 (a long decode) in it holding 2 of its
    ``num_blocks`` blocks of 4 tokens."""
    overrides.setdefault("kv_growth_reserve", 0)  # the blocks are few on purpose
    core = make_core(num_blocks=num_blocks, cost_model=LINEAR, policy="predictive",
                     max_batch_size=1, **overrides)
    core.arrival_probes = True
    core.add(make_job(0, prompt_len=5, max_tokens=50), 0.0)
    run_step(core, 0.0, {0: 7})  # its prefill; its first token's estimate is none
    return core


def test_jobs_that_wait_are_probed_once_with_their_prompts_tail():
    core = _busy_core(arrival_probe_tokens=3)
    core.add(make_job(1, prompt_len=2, max_tokens=40), 0.05)
    core.add(make_job(2, prompt_len=8, max_tokens=40), 0.05)
    core.add(make_job(3, prompt_len=2, max_tokens=40), 0.05)
    plan = core.schedule(0.1)
    # All rank first (no prediction yet), the batch holds one: job 1 runs, 2 and 3 wait,
    # and the oldest of them, 2, finds 2 blocks free for the 3 its prompt needs.
    assert [c.job_id for c in plan.commands] == [1]
    assert [(p.job_id, p.token_ids, p.prompt_tokens) for p in plan.probes] == [
        (2, [15, 16, 17], 8), (3, [10, 11], 2)]  # the last 3 tokens; a shorter whole prompt
    _answer(core, plan, 0.1, {2: 12.0, 3: 5.0})
    job = core.jobs[2]
    assert job.predicted_output_tokens == 12.0 == job.first_predicted_output_tokens
    assert not job.started
    plan = core.schedule(0.2)
    assert plan.probes == []  # estimated: never probed again


def test_a_waiting_job_is_ranked_by_its_estimate_before_its_prefill():
    """Without estimates new jobs rank first, in arrival order; with them the one predicted
    shorter goes first, and behind a started job predicted shorter still."""
    core = _busy_core(arrival_probe_tokens=4)
    plan = core.schedule(0.02)
    results = [TokenResult(0, plan.commands[0].num_computed, 7, None, 5.0)]
    core.update(plan.step_id, StepResult(results, [], 0.01), 0.03)
    for jid in (1, 2, 3):
        core.add(make_job(jid, prompt_len=6, max_tokens=40), 0.04)
    plan = core.schedule(0.05)  # 1 takes the slot (it ranks first, unpredicted), 2, 3 wait
    assert [c.job_id for c in plan.commands] == [1]
    assert [p.job_id for p in plan.probes] == [2, 3]
    assert plan.probes[0].token_ids == [12, 13, 14, 15]  # the last 4 of 6
    _answer(core, plan, 0.05, {2: 30.0, 3: 9.0})
    # Job 1's prefill gave it no estimate: it ranks by tokens made (1); job 0 has 4 left.
    assert [j.job_id for j in core.policy.order(0.07)] == [1, 0, 3, 2]
    core2 = _busy_core(arrival_probe_tokens=0)  # the probes off: no estimate, no probe
    for jid in (1, 2, 3):
        core2.add(make_job(jid, prompt_len=6, max_tokens=40), 0.04)
    plan = core2.schedule(0.05)
    assert plan.probes == [] and core2.jobs[2].predicted_output_tokens is None


def test_a_job_that_waits_only_for_a_batch_slot_is_not_probed():
    """Its first token, a Step or two away, brings the same estimate for free."""
    core = _busy_core(num_blocks=64)
    core.add(make_job(1, prompt_len=6, max_tokens=40), 0.05)
    core.add(make_job(2, prompt_len=6, max_tokens=40), 0.05)
    plan = core.schedule(0.1)
    assert [c.job_id for c in plan.commands] == [1] and plan.probes == []
    _answer(core, plan, 0.1, {})
    plan = core.schedule(0.2)  # 2 now takes the slot
    assert [c.job_id for c in plan.commands] == [2] and plan.probes == []
    assert core.stats().num_probes == 0


def test_jobs_behind_more_than_two_steps_of_prompts_are_probed_with_room_to_spare():
    """Plenty of blocks, but the prompts waiting to start fill more than two Steps' prefill
    tokens: the jobs left out wait for prefill, and are probed."""
    core = _busy_core(num_blocks=64, max_batched_tokens=8)
    for jid in range(1, 5):
        core.add(make_job(jid, prompt_len=6, max_tokens=40), 0.05)  # 24 > 2 x 8 tokens
    plan = core.schedule(0.1)
    assert [c.job_id for c in plan.commands] == [1]
    assert [p.job_id for p in plan.probes] == [2]  # 6 probe tokens of 8, then the budget
    core2 = _busy_core(num_blocks=64, max_batched_tokens=9)
    for jid in range(1, 4):
        core2.add(make_job(jid, prompt_len=6, max_tokens=40), 0.05)  # 18, not over 2 x 9
    assert core2.schedule(0.1).probes == []


def test_probe_tokens_per_step_are_bounded_and_the_rest_wait_their_turn():
    core = _busy_core(arrival_probe_tokens=8, max_batched_tokens=20)
    for jid in range(1, 6):
        core.add(make_job(jid, prompt_len=10, max_tokens=40), 0.05)
    plan = core.schedule(0.1)
    first = [p.job_id for p in plan.probes]
    assert sum(len(p.token_ids) for p in plan.probes) <= 20 and len(first) == 2
    _answer(core, plan, 0.1, dict.fromkeys(first, 40.0))
    plan = core.schedule(0.2)
    second = [p.job_id for p in plan.probes]
    assert second and not set(second) & set(first)


def test_only_a_policy_that_ranks_by_predictions_is_probed():
    core = make_core(cost_model=LINEAR, policy="skip-join-mlfq", max_batch_size=1)
    core.arrival_probes = core.policy.ranks_by_prediction
    core.add(make_job(0, prompt_len=5, max_tokens=50), 0.0)
    core.add(make_job(1, prompt_len=5, max_tokens=50), 0.0)
    plan = core.schedule(0.0)
    assert plan.probes == [] and not core.arrival_probes


def test_an_estimate_for_a_job_that_started_meanwhile_is_not_taken():
    core = _busy_core()
    core.add(make_job(1, prompt_len=5, max_tokens=40), 0.05)
    core.add(make_job(2, prompt_len=5, max_tokens=40), 0.05)
    plan = core.schedule(0.1)
    assert [p.job_id for p in plan.probes] == [2]
    core.jobs[2].first_scheduled_time = 0.1  # as if another plan in flight had started it
    _answer(core, plan, 0.1, {2: 9.0}, check=False)
    assert core.jobs[2].predicted_output_tokens is None


def test_probes_and_estimates_cross_the_wire_and_a_bad_estimate_is_refused():
    plan = StepPlan(step_id=4, probes=[ArrivalProbe(3, [5, 6, 7], 9)])
    msg = wire.plan_to_proto(plan)
    assert [(p.job_id, list(p.token_ids), p.prompt_tokens) for p in msg.probes] == [
        (3, [5, 6, 7], 9)]
    from fastserve.proto import worker_pb2 as wpb

    reply = wpb.StepResponse(step_id=4, estimates=[wpb.ArrivalEstimate(
        job_id=3, predicted_output_tokens=17.5)])
    result = wire.result_from_proto(reply)
    assert result.estimates == [(3, 17.5)]
    wire.check_result(plan, result, vocab_size=100)
    for bad in ([(4, 17.5)], [(3, 0.0)], [(3, math.nan)], [(3, math.inf)]):
        with pytest.raises(wire.BadWorkerReply, match="estimated job"):
            wire.check_result(plan, StepResult(estimates=bad), vocab_size=100)


def _burst(n_long: int, n_short: int) -> list[TraceRequest]:
    """Long answers first, then short ones, all at once, every prompt 480 tokens."""
    return ([TraceRequest(0.0, 480, 100) for _ in range(n_long)]
            + [TraceRequest(0.001, 480, 8) for _ in range(n_short)])


def test_the_simulated_worker_answers_probes_and_charges_them():
    """In simulation a waiting job's estimate is its first token's (exact here), so the short
    answers of a burst overtake the long ones queued before them for the memory (it holds two
    jobs); each probe costs prefill: the first iteration, which carries them, takes longer."""
    from scheduler_svc.core.config import SchedulerConfig

    runs = {}
    for k in (0, 128):
        config = SchedulerConfig(policy="predictive", max_batch_size=2, arrival_probe_tokens=k)
        runs[k] = simulate(_burst(6, 6), config=config, cost_model=LINEAR, num_blocks=80,
                           block_size=16, prediction_sigma=0.0, prediction_refresh=16,
                           check_invariants=True)

    def jct(run, n):
        return sum(r.finish_s - r.arrival_s for r in run.records if r.output_tokens == n)

    assert jct(runs[128], 8) < 0.75 * jct(runs[0], 8)
    assert jct(runs[128], 100) > jct(runs[0], 100)
    assert runs[128].records[0].first_token_s > runs[0].records[0].first_token_s


def test_the_simulated_tail_error_applies_only_to_prompts_longer_than_the_tail():
    """(One 64-token job fills the 10 blocks: the others wait for memory, probed.)"""
    from scheduler_svc.core.config import SchedulerConfig

    def run(err, prompt):
        config = SchedulerConfig(policy="predictive", max_batch_size=1, arrival_probe_tokens=16)
        reqs = [TraceRequest(0.0, prompt, 40 + 3 * i) for i in range(5)]
        r = simulate(reqs, config=config, cost_model=LINEAR, num_blocks=10, block_size=16,
                     prediction_sigma=0.0, prediction_refresh=16, arrival_probe_error=err)
        return [round(x.finish_s, 6) for x in r.records]

    assert run(0.0, 8) == run(2.0, 8)  # the tail is the whole prompt: no extra error
    assert run(0.0, 64) != run(2.0, 64)
