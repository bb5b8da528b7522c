"""The scheduler's /metrics endpoint over real HTTP, fed by cores driven with hand-built results.

The loops are stand-ins with a WorkerLoop's ``address``, ``ready`` and ``core``: enough for the
exporter, which reads nothing else.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from procs import scrape_metrics

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import StepResult, TokenResult
from scheduler_svc.core.group import GroupCore
from scheduler_svc.core.job import Job, JobStatus
from scheduler_svc.loop import IterationStats
from scheduler_svc.metrics import SchedulerMetrics

EOS = 2
MODEL = "tiny-llama"


@dataclass
class FakeLoop:
    address: str
    core: GroupCore | None
    ready: bool = True

    @property
    def stats(self):
        return self.core.stats() if self.core is not None else None


def make_core(num_blocks=64, block_size=4) -> GroupCore:
    return GroupCore(SchedulerConfig(), num_blocks, block_size, 256)


def make_job(job_id, prompt_len=5, max_tokens=4, now=0.0) -> Job:
    return Job(job_id, list(range(10, 10 + prompt_len)), max_tokens, now,
               eos_token_ids=frozenset({EOS}))


def run_step(core, now, token=7):
    """One iteration answered like a worker; returns the jobs it finished."""
    plan = core.schedule(now)
    results = []
    for cmd in plan.commands:
        job = core.jobs[cmd.job_id]
        done = cmd.num_computed
        results.append(TokenResult(cmd.job_id, done, token if done == job.num_tokens else None))
    updates = core.update(plan.step_id, StepResult(results, [], 0.01), now + 0.01)
    return [u.job for u in updates if u.finished]


def labels(**kw) -> frozenset:
    return frozenset(kw.items())


@pytest.fixture
def metrics():
    m = SchedulerMetrics("fcfs", model_name=MODEL)
    m.port = m.serve(0)
    yield m
    m.close()


def test_gauges_follow_the_cores_of_every_worker(metrics):
    busy, idle = make_core(num_blocks=64), make_core(num_blocks=32)
    for i in range(3):
        busy.add(make_job(i, prompt_len=8), 0.0)  # 8 tokens = 2 blocks each
    run_step(busy, 0.0)
    busy.add(make_job(3), 1.0)
    busy.add(make_job(4), 1.0)
    used = busy.kv.allocator.num_used
    assert used >= 6
    metrics.bind([FakeLoop("w0:1", busy), FakeLoop("w1:1", idle, ready=False),
                  FakeLoop("w2:1", None, ready=False)])

    m = scrape_metrics(metrics.port)
    w0, w1 = labels(worker="w0:1"), labels(worker="w1:1")
    assert m[("fastserve:num_requests_running", w0)] == 3
    assert m[("fastserve:num_requests_waiting", w0)] == 2
    assert m[("fastserve:num_requests_running", w1)] == 0
    assert m[("fastserve:kv_blocks_used", w0)] == used
    assert m[("fastserve:kv_blocks_total", w0)] == 64
    assert m[("fastserve:kv_cache_usage_perc", w0)] == pytest.approx(used / 64)
    assert m[("fastserve:kv_cache_usage_perc", w1)] == 0
    assert m[("fastserve:queue_depth", labels(worker="w0:1", queue="fcfs"))] == 5
    assert m[("fastserve:iterations_total", w0)] == 1
    assert m[("fastserve:num_preemptions_total", w0)] == 0
    assert m[("fastserve:worker_up", w0)] == 1
    assert m[("fastserve:worker_up", w1)] == 0
    assert m[("fastserve:worker_up", labels(worker="w2:1"))] == 0
    assert ("fastserve:num_requests_running", labels(worker="w2:1")) not in m  # no core yet
    assert m[("fastserve:info", labels(policy="fcfs", model=MODEL))] == 1

    # The vLLM names, summed over workers: what vLLM-aware routers and autoscalers read.
    model = labels(model_name=MODEL)
    assert m[("vllm:num_requests_running", model)] == 3
    assert m[("vllm:num_requests_waiting", model)] == 2
    assert m[("vllm:kv_cache_usage_perc", model)] == pytest.approx(used / (64 + 32))

    for job in list(busy.jobs.values()):
        busy.finish(job, JobStatus.CANCELLED, 2.0)
    m = scrape_metrics(metrics.port)
    assert m[("fastserve:num_requests_running", w0)] == 0
    assert m[("fastserve:kv_blocks_used", w0)] == 0
    assert m[("vllm:kv_cache_usage_perc", model)] == 0


def test_finished_requests_and_iterations(metrics):
    core = make_core()
    for i in range(3):
        core.add(make_job(i, prompt_len=5, max_tokens=4), 0.0)
    core.add(make_job(3, prompt_len=6, max_tokens=4), 0.0)
    finished = run_step(core, 0.0)  # every prompt, and a first token for each at 0.01
    gone = core.jobs[3]
    core.finish(gone, JobStatus.CANCELLED, 0.5)  # one token, then the client left
    t = 0.0
    while core.has_work():
        t += 1.0
        finished += run_step(core, t)
    assert len(finished) == 3 and all(j.status == JobStatus.FINISHED_LENGTH for j in finished)
    never_ran = make_job(9, prompt_len=6)
    never_ran.status, never_ran.finish_time = JobStatus.CANCELLED, 0.2
    for job in [*finished, gone, never_ran]:
        metrics.observe_finished(job)
    metrics.observe_iteration(IterationStats(batch_size=4, num_tokens=20, compute_s=0.010,
                                             round_trip_s=0.012, overhead_s=0.003))

    m = scrape_metrics(metrics.port)
    assert m[("fastserve:requests_total", labels(finish_reason="length"))] == 3
    assert m[("fastserve:requests_total", labels(finish_reason="cancelled"))] == 2
    assert m[("fastserve:prompt_tokens_total", frozenset())] == 3 * 5 + 6 + 6
    assert m[("fastserve:generation_tokens_total", frozenset())] == 3 * 4 + 1
    # Arrival at 0, first token at 0.01, then one token a second up to max_tokens = 4.
    assert m[("fastserve:time_to_first_token_seconds_count", frozenset())] == 4
    assert m[("fastserve:time_to_first_token_seconds_sum", frozenset())] == pytest.approx(0.04)
    assert m[("fastserve:time_per_output_token_seconds_count", frozenset())] == 3  # n_out > 1
    assert m[("fastserve:time_per_output_token_seconds_sum", frozenset())] == pytest.approx(3.0)
    assert m[("fastserve:e2e_request_latency_seconds_count", frozenset())] == 5
    assert m[("fastserve:e2e_request_latency_seconds_sum", frozenset())] == pytest.approx(
        3 * 3.01 + 0.5 + 0.2)
    assert m[("fastserve:request_queue_time_seconds_count", frozenset())] == 4  # 9 never ran
    assert m[("fastserve:iteration_time_seconds_sum", frozenset())] == pytest.approx(0.010)
    assert m[("fastserve:iteration_overhead_seconds_sum", frozenset())] == pytest.approx(0.005)
    assert m[("fastserve:iteration_batch_size_bucket", labels(le="2.0"))] == 0
    assert m[("fastserve:iteration_batch_size_bucket", labels(le="4.0"))] == 1
