"""The predictive policy: shortest predicted remaining output first, attained service once a
prediction is outlived, starvation promotion with backoff; and the simulator's noisy
predictions it is evaluated with."""

from __future__ import annotations

import pytest
from core_driver import LINEAR, make_core, make_job, run_step

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


def test_a_starving_job_goes_to_the_front_with_a_doubling_limit():
    core = make_core(cost_model=LINEAR, policy="predictive", starve_limit_s=1.0)
    pol = core.policy
    core.add(make_job(0, max_tokens=100, predicted_output_tokens=90.0), 0.0)
    core.add(make_job(1, max_tokens=100, predicted_output_tokens=1.0), 0.0)
    assert [j.job_id for j in pol.order(0.5)] == [1, 0]
    pol.on_iteration([core.jobs[1]], 0.01, 0.9)  # job 1 runs; job 0 waits
    assert [j.job_id for j in pol.order(1.01)] == [0, 1] and pol.num_promotions == 1
    pol.on_iteration([core.jobs[0], core.jobs[1]], 0.01, 1.02)  # job 0 ran: next limit 2 s
    pol.on_iteration([core.jobs[1]], 0.01, 2.9)
    assert [j.job_id for j in pol.order(2.5)] == [1, 0]
    assert [j.job_id for j in pol.order(3.03)] == [0, 1] and pol.num_promotions == 2


def test_simulated_predictions_are_noisy_truth_and_predictive_beats_fcfs():
    from test_simulator import SHARED_TRACES

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
