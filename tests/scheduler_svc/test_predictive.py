"""The predictive policy: shortest predicted remaining output first, attained service once a
prediction is outlived, starvation promotion with backoff; and the simulator's noisy
predictions it is evaluated with."""

from __future__ import annotations

import functools
import json
import random

import pytest
from core_driver import LINEAR, make_core, make_job, run_step
from test_simulator import SHARED_TRACES

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import OPT_13B_A100
from scheduler_svc.core.policies.predictive import Predictive
from scheduler_svc.sim import simulate


def test_the_shortest_predicted_remaining_output_runs_first():
    core = make_core(cost_model=LINEAR, policy="predictive", max_batch_size=1)
    for jid, predicted in ((0, 50.0), (1, 5.0), (2, None), (3, 20.0)):
        core.add(make_job(jid, prompt_len=3, max_tokens=100,
                          predicted_output_tokens=predicted), 0.0)
    # No prediction ranks by tokens made (0 so far): first, as least attained service would.
    assert [j.job_id for j in core.policy.order(0.0)] == [2, 1, 3, 0]
    ran = [run_step(core, 0.01 * i)[0].commands[0].job_id for i in range(3)]
    assert ran == [2, 2, 2]  # its tokens made (1, 2) stay under job 1's predicted 5


def test_a_job_past_its_prediction_ranks_by_the_tokens_it_made():
    job = make_job(0, max_tokens=100, predicted_output_tokens=4.0)
    job.output = [7] * 3
    assert Predictive.remaining(job) == 1.0
    job.output = [7] * 10  # outlived: it has run long, so it is likely to run longer
    assert Predictive.remaining(job) == 10.0


def test_a_starving_job_goes_to_the_front_with_a_limit_that_grows_with_its_size_and_doubles():
    core = make_core(cost_model=LINEAR, policy="predictive", starve_limit_s=1.0,
                     starve_tokens=16.0)
    pol = core.policy
    # 24 tokens to come: it may wait 1 s x (1 + 24 / 16) = 2.5 s.
    core.add(make_job(0, max_tokens=100, predicted_output_tokens=24.0), 0.0)
    core.add(make_job(1, max_tokens=100, predicted_output_tokens=1.0), 0.0)
    assert [j.job_id for j in pol.order(0.5)] == [1, 0]
    a, b = core.jobs[0], core.jobs[1]
    for t in (0.9, 1.9):  # job 1 runs (its own limit is 1.06 s); job 0 waits
        pol.on_iteration([b], 0.01, t)
    assert [j.job_id for j in pol.order(2.4)] == [1, 0] and pol.num_promotions == 0
    pol.on_iteration([b], 0.01, 2.45)
    assert [j.job_id for j in pol.order(2.51)] == [0, 1] and pol.num_promotions == 1
    pol.on_iteration([a, b], 0.01, 2.52)  # job 0 ran: its next limit is 5 s
    for t in (3.5, 4.5, 5.5, 6.5, 7.0):
        pol.on_iteration([b], 0.01, t)
    assert [j.job_id for j in pol.order(7.5)] == [1, 0]
    assert [j.job_id for j in pol.order(7.53)] == [0, 1] and pol.num_promotions == 2
    # A job with nothing predicted waits the plain limit.
    core.add(make_job(2, max_tokens=100), 7.6)
    assert pol.starvation.deadline(2) == pytest.approx(8.6)


@pytest.mark.parametrize("starve_tokens", [None, 2.0, 16.0])
def test_the_starvation_limit_grows_by_one_limit_per_starve_tokens_predicted(starve_tokens):
    settings = {} if starve_tokens is None else {"starve_tokens": starve_tokens}
    core = make_core(cost_model=LINEAR, policy="predictive", starve_limit_s=2.0, **settings)
    per_limit = starve_tokens or 4.0  # the default
    core.add(make_job(0, max_tokens=100, predicted_output_tokens=24.0), 1.0)
    core.add(make_job(1, max_tokens=100), 1.0)  # nothing predicted: the plain limit
    want = 1.0 + 2.0 * (1 + 24 / per_limit)
    assert core.policy.starvation.deadline(0) == pytest.approx(want)
    assert core.policy.starvation.deadline(1) == pytest.approx(3.0)
    b = core.jobs[1]
    core.policy.on_iteration([b], 0.01, want - 0.02)  # job 1 runs; job 0 waits
    assert [j.job_id for j in core.policy.order(want - 0.01)] == [1, 0]
    assert core.policy.num_promotions == 0
    assert [j.job_id for j in core.policy.order(want + 0.01)] == [0, 1]
    assert core.policy.num_promotions == 1


def test_starve_tokens_must_be_positive():
    with pytest.raises(ValueError, match="starve_tokens must be > 0"):
        SchedulerConfig(starve_tokens=0.0)


@pytest.mark.skipif(not (SHARED_TRACES / "AzureLLMInferenceTrace_conv.csv").is_file(),
                    reason="the shared traces are not here")
def test_simulated_predictions_are_noisy_truth_and_predictive_beats_fcfs():

    from fastserve.traces import load_trace

    reqs = load_trace(str(SHARED_TRACES / "AzureLLMInferenceTrace_conv.csv"), rate=1.5,
                      num_requests=300, seed=0)

    def run(policy, sigma):
        return simulate(reqs, config=SchedulerConfig(policy=policy, max_batch_size=16),
                        cost_model=OPT_13B_A100, num_blocks=4096, prediction_sigma=sigma)

    fcfs = run("fcfs", None).summary()["mean_jct_s"]
    exact, noisy = (run("predictive", s).summary()["mean_jct_s"] for s in (0.0, 0.5))
    assert exact < 0.9 * fcfs and noisy < fcfs and exact <= noisy, (fcfs, exact, noisy)
    assert run("predictive", 1.0).summary() == run("predictive", 1.0).summary()  # seeded
    with pytest.raises(ValueError, match="prediction_sigma"):
        run("predictive", -1.0)


def test_recorded_predictions_reach_their_requests_in_trace_order(tmp_path, capsys):
    """``--predictions FILE``: one per request, in the trace's order; exact ones give the same
    run as sigma 0, and a bad line or count is named."""
    from test_simulator import make_requests

    from fastserve.cli import main
    from scheduler_svc.sim.simulator import simulate as sim

    reqs = make_requests(60, rate=20.0)
    config = SchedulerConfig(policy="predictive", max_batch_size=4)

    def run(**kw):
        return sim(reqs, config=config, cost_model=LINEAR, num_blocks=256, **kw).summary()

    exact = [float(r.output_tokens) for r in reqs]
    assert run(predictions=exact) == run(prediction_sigma=0.0)
    assert run(predictions=exact[::-1]) != run(predictions=exact)
    with pytest.raises(ValueError, match="59 predictions for 60 requests"):
        run(predictions=exact[:-1])
    with pytest.raises(ValueError, match="not both"):
        run(predictions=exact, prediction_sigma=1.0)
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": r.arrival_s, "input_tokens": r.input_tokens,
                                         "output_tokens": r.output_tokens}) + "\n"
                             for r in reqs))
    preds = tmp_path / "p.jsonl"
    preds.write_text("".join(json.dumps({"predicted_output_tokens": v}) + "\n"
                             for v in exact[:-1]) + "oops\n")
    assert main(["sim", "--trace", str(trace), "--policies", "predictive",
                 "--predictions", str(preds), "--cost-model", "opt-13b-a100"]) == 2
    assert f"{preds}:60" in capsys.readouterr().err


def test_the_workers_predictions_rank_jobs_and_their_error_is_counted():
    """Predictions arrive with sampled tokens: each is a total within the cap, the latest
    ranks the job, the first is kept and scored against the length the job reached."""
    from scheduler_svc.core.contract import StepResult, TokenResult

    core = make_core(cost_model=LINEAR, policy="predictive", max_batch_size=2)
    core.add(make_job(0, max_tokens=6), 0.0)
    core.add(make_job(1, max_tokens=6), 0.0)
    plan = core.schedule(0.0)
    results = [TokenResult(c.job_id, c.num_computed, 7, -0.1,
                           {0: 3.0, 1: 40.0}[c.job_id]) for c in plan.commands]
    core.update(plan.step_id, StepResult(results, [], 0.01), 0.01)
    a, b = core.jobs[0], core.jobs[1]
    assert (a.predicted_output_tokens, b.predicted_output_tokens) == (4.0, 6.0)  # b capped
    assert a.first_predicted_output_tokens == 4.0
    assert [j.job_id for j in core.policy.order(0.02)] == [0, 1]
    plan = core.schedule(0.02)
    results = [TokenResult(c.job_id, c.num_computed, 7, -0.1, 0.0 if c.job_id == 1 else None)
               for c in plan.commands]
    core.update(plan.step_id, StepResult(results, [], 0.01), 0.03)
    # A live job makes at least one more token (its end-of-sequence one): 0 reads as 1.
    assert b.predicted_output_tokens == 3.0 and b.first_predicted_output_tokens == 6.0
    assert [j.job_id for j in core.policy.order(0.04)] == [1, 0]  # the refresh re-ranks
    for i in range(8):
        run_step(core, 0.05 + 0.02 * i)
    stats = core.stats()
    assert not core.jobs and stats.num_predicted == 2
    # Both ran to their cap of 6: |4 - 6| and |6 - 6|.
    assert stats.prediction_mae_tokens == pytest.approx(1.0)


def test_the_oracle_reads_the_clients_hint_before_the_cap():
    core = make_core(cost_model=LINEAR, policy="srpt-oracle")
    core.add(make_job(0, max_tokens=100, output_length_hint=30), 0.0)
    core.add(make_job(1, max_tokens=50), 0.0)
    core.add(make_job(2, max_tokens=100, output_length_hint=10), 0.0)
    assert [j.job_id for j in core.policy.order(0.0)] == [2, 0, 1]


@pytest.fixture
def predictions_seen(monkeypatch) -> dict[int, list[tuple[int, float, float]]]:
    """Every prediction the core takes from a worker's results, by job id: (tokens made,
    predicted remaining, the total kept), filled as runs go (clear it between runs)."""
    from scheduler_svc.core.group import GroupCore

    seen: dict[int, list[tuple[int, float, float]]] = {}
    real = GroupCore._predicted

    def spy(job, remaining):
        real(job, remaining)
        seen.setdefault(job.job_id, []).append((len(job.output), remaining,
                                                job.predicted_output_tokens))

    monkeypatch.setattr(GroupCore, "_predicted", staticmethod(spy))
    return seen


def test_the_simulated_worker_predicts_at_the_first_token_and_every_refresh(predictions_seen):
    """``prediction_refresh``: no prediction at arrival; one with the 1st, 17th, 33rd... token,
    the true remaining times the job's own ratio, never past the context (not the job's true
    length, which the simulator ends it at); fast-forwarded runs stop at each."""
    from test_simulator import make_requests

    from scheduler_svc.sim.simulator import simulate as sim

    seen = predictions_seen
    reqs = make_requests(30, rate=5.0)
    for policy in ("fcfs", "predictive"):  # fcfs fast-forwards decode runs
        seen.clear()
        result = sim(reqs, config=SchedulerConfig(policy=policy, max_batch_size=4),
                     cost_model=LINEAR, num_blocks=512, prediction_sigma=0.0,
                     prediction_refresh=16)
        assert len(result.records) == len(reqs) and len(seen) == len(reqs)
        for jid, preds in seen.items():
            n = reqs[jid].output_tokens  # make_requests arrive in order: job id = index
            assert [made for made, _, _ in preds] == list(range(1, n + 1, 16)), (policy, jid)
            assert all(rem == n - made for made, rem, _ in preds)  # sigma 0: exact
    # An overestimate is kept past the true length (the simulated job's max_tokens), within
    # the context: twice the truth, recorded, gives twice what is left at every refresh.
    seen.clear()
    config = SchedulerConfig(policy="predictive", max_batch_size=4)
    run = functools.partial(sim, reqs, config=config, cost_model=LINEAR, num_blocks=512)
    run(predictions=[2.0 * r.output_tokens for r in reqs], prediction_refresh=16)
    for jid, preds in seen.items():
        n = reqs[jid].output_tokens
        assert all(total == made + max(2.0 * (n - made), 1.0) for made, _, total in preds)
    # Told at arrival too, new jobs are ranked before their first token: another run.
    assert (run(prediction_sigma=0.5, prediction_refresh=16).summary()
            != run(prediction_sigma=0.5, prediction_refresh=16,
                   predict_at_arrival=True).summary())
    with pytest.raises(ValueError, match="prediction_refresh needs"):
        run(prediction_refresh=16)
    with pytest.raises(ValueError, match="predict_at_arrival is for prediction_refresh"):
        run(prediction_sigma=0.5, predict_at_arrival=True)


def test_refreshed_errors_drawn_anew_follow_the_job_not_the_policy(predictions_seen):
    """``prediction_refresh_corr`` < 1: the first refresh keeps the job's own error, later ones
    drift from it (an AR(1) in log space), the same draws whatever the policy runs first."""
    from test_simulator import make_requests

    from scheduler_svc.sim.simulator import simulate as sim

    seen: dict[str, dict[int, list[tuple[int, float]]]] = {}
    reqs = make_requests(30, rate=5.0)
    ratio = [2.0 if i % 2 else 0.5 for i in range(len(reqs))]  # first errors of +-log 2
    preds = [f * r.output_tokens for f, r in zip(ratio, reqs)]
    for policy in ("fcfs", "predictive"):
        predictions_seen.clear()
        sim(reqs, config=SchedulerConfig(policy=policy, max_batch_size=4), cost_model=LINEAR,
            num_blocks=512, predictions=preds, prediction_refresh=16,
            prediction_refresh_corr=0.5)
        seen[policy] = {jid: [(made, rem) for made, rem, _ in got]
                        for jid, got in predictions_seen.items()}
    assert seen["fcfs"] == seen["predictive"]
    drifted = 0
    for jid, got in seen["fcfs"].items():
        n = reqs[jid].output_tokens
        assert got[0] == (1, ratio[jid] * (n - 1))
        drifted += sum(1 for made, rem in got[1:]
                       if n > made and rem != ratio[jid] * (n - made))
    assert drifted > 0
    with pytest.raises(ValueError, match="prediction_refresh_corr must be in"):
        sim(reqs, config=SchedulerConfig(policy="predictive"), cost_model=LINEAR,
            num_blocks=512, predictions=preds, prediction_refresh=16,
            prediction_refresh_corr=1.5)
    with pytest.raises(ValueError, match="prediction_refresh_corr is for prediction_refresh"):
        sim(reqs, config=SchedulerConfig(policy="predictive"), cost_model=LINEAR,
            num_blocks=512, predictions=preds, prediction_refresh_corr=0.5)


@pytest.mark.parametrize("later, passes", [(1.0, True), (1.2, True), (1.4, False),
                                           (5.0, False)])
def test_aged_a_job_passes_an_earlier_one_only_within_a_time_per_halving(later, passes):
    # Aging 1 s: job 1, predicted 40 tokens, comes ``later`` s after job 0, predicted 100:
    # log2(101 / 41) = 1.30 halvings, so it goes first only if it came within 1.30 s.
    core = make_core(cost_model=LINEAR, policy="predictive", predictive_aging_s=1.0,
                     starve_limit_s=1e6)
    core.add(make_job(0, max_tokens=200, predicted_output_tokens=100.0, now=0.0), 0.0)
    core.add(make_job(1, max_tokens=200, predicted_output_tokens=40.0, now=later), later)
    assert [j.job_id for j in core.policy.order(later)] == ([1, 0] if passes else [0, 1])
    plain = make_core(cost_model=LINEAR, policy="predictive", starve_limit_s=1e6)
    plain.add(make_job(0, max_tokens=200, predicted_output_tokens=100.0, now=0.0), 0.0)
    plain.add(make_job(1, max_tokens=200, predicted_output_tokens=40.0, now=later), later)
    assert [j.job_id for j in plain.policy.order(later)] == [1, 0]  # off: SRPT, whenever


def test_predictive_aging_must_not_be_negative():
    with pytest.raises(ValueError, match="predictive_aging_s must be >= 0"):
        SchedulerConfig(predictive_aging_s=-0.5)


@pytest.mark.parametrize("aging", [0.0, 0.05])
@pytest.mark.parametrize("seed", range(40))
def test_steady_iterations_is_how_long_the_batch_stays_first_and_in_order(seed, aging):
    """``steady_iterations`` (the simulator applies that many decodes of a repeatable plan's
    batch at once) against the walk itself, one token further each time: predictions under,
    at and past the tokens made, and none, so keys fall, jump and grow and cross each other
    and the waiting jobs' keys; aged keys too, the jobs arriving apart."""
    rng = random.Random(seed)
    core = make_core(cost_model=LINEAR, policy="predictive", max_batch_size=3,
                     num_blocks=256, max_context=1024, starve_limit_s=1e6,
                     predictive_aging_s=aging)
    for jid in range(6):
        at = rng.uniform(0, 0.3) if aging else 0.0
        core.add(make_job(jid, prompt_len=2, max_tokens=500, now=at,
                          predicted_output_tokens=rng.choice(
            [None, float(rng.randint(1, 60)), rng.uniform(1, 60), rng.uniform(1, 60)])), at)
    steps = rng.randint(2, 40)
    for i in range(200):
        run_step(core, 0.01 * i)
        if i >= steps and core.repeatable_plan is not None:
            break
    assert core.repeatable_plan is not None
    pol = core.policy
    batch = [core.jobs[c.job_id] for c in core.repeatable_plan.commands]
    starts = [3.0 + 0.01 * i for i in range(40)]
    k = pol.steady_iterations(batch, 0.01, starts)
    made = [(list(job.output), job.kv.num_computed) for job in batch]
    expected = 0
    while expected < len(starts):
        for job, (out, computed) in zip(batch, made):  # as ``expected`` more decodes leave it
            job.output, job.kv.num_computed = out + [7] * expected, computed + expected
        if list(pol.order(3.0))[:len(batch)] != batch:
            break
        expected += 1
    for job, (out, computed) in zip(batch, made):
        job.output, job.kv.num_computed = out, computed
    assert k == expected


def test_a_prediction_to_the_cap_is_bounded_by_the_job_s_own_cap():
    """The worker predicts ``inf`` for an answer that loops; across the wire (a float) and into
    the core it becomes the job's cap, and the job ranks by what it has left to make."""
    from scheduler_svc.core.group import GroupCore
    from scheduler_svc.wire import result_from_proto
    from worker_svc.engine import JobResult, StepOutcome
    from worker_svc.wire import step_outcome_to_proto

    msg = step_outcome_to_proto(StepOutcome(results=[JobResult(3, 9, 42, -0.1, float("inf"))]),
                                step_id=1, num_used_blocks=1, num_free_blocks=0)
    (r,) = result_from_proto(msg).results
    assert r.predicted_remaining == float("inf")
    job = make_job(3, max_tokens=100)
    job.output = [42] * 30
    GroupCore._predicted(job, r.predicted_remaining)
    assert job.predicted_output_tokens == 100.0 and Predictive.remaining(job) == 70.0
