"""The worker's /metrics endpoint, scraped over HTTP from a real ``python -m worker_svc``."""

from __future__ import annotations

import re

import pytest
from procs import scrape_metrics
from test_worker_server import NUM_BLOCKS, StepStream, Worker, new_job

from fastserve.proto import worker_pb2 as pb


@pytest.fixture(scope="module")
def worker(tiny_llama_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("logs")
    w = Worker(tiny_llama_dir, logs, logs / "worker.log", "--metrics-port", "0")
    yield w
    assert w.terminate() == 0, w.log()


def metrics_port(worker: Worker) -> int:
    # Logged before the "worker listening" line, which the fixture has already read.
    found = re.search(r"metrics on :(\d+)", worker.log_path.read_text())
    assert found, worker.log()
    return int(found.group(1))


def test_step_counters_and_kv_gauges(worker):
    port = metrics_port(worker)
    before = scrape_metrics(port)
    assert before[("fastserve:worker_kv_blocks_total", frozenset())] == NUM_BLOCKS
    assert before[("fastserve:worker_kv_blocks_used", frozenset())] == 0
    assert before[("fastserve:worker_steps_total", frozenset())] == 0

    stream = StepStream(worker.stub)
    r = stream.step(
        new_jobs=[new_job(1, [5, 6, 7], [0, 1])],
        commands=[pb.JobCommand(job_id=1, num_tokens=3), pb.JobCommand(job_id=9, num_tokens=1)],
    )
    assert [e.job_id for e in r.errors] == [9]  # unknown job: counted by code
    during = scrape_metrics(port)
    stream.close()
    after = scrape_metrics(port)

    assert during[("fastserve:worker_steps_total", frozenset())] >= 1
    assert during[("fastserve:worker_tokens_total", frozenset())] == 4
    assert during[("fastserve:worker_step_batch_tokens_count", frozenset())] >= 1
    assert during[("fastserve:worker_step_compute_seconds_sum", frozenset())] > 0
    assert during[("fastserve:worker_job_errors_total", frozenset({("code", "not_found")}))] == 1
    assert during[("fastserve:worker_kv_blocks_used", frozenset())] == 2
    assert during[("fastserve:worker_jobs", frozenset())] == 1
    # Closing the stream frees its jobs outside any Step.
    assert after[("fastserve:worker_kv_blocks_used", frozenset())] == 0
    assert after[("fastserve:worker_jobs", frozenset())] == 0


def test_swap_metrics_from_step_outcomes():
    from types import SimpleNamespace

    from worker_svc.engine import StepOutcome, SwapStats
    from worker_svc.metrics import WorkerMetrics

    engine = SimpleNamespace(
        pool=SimpleNamespace(num_used_blocks=3, num_blocks=8), jobs={1: None, 2: None},
        swap=SimpleNamespace(num_offloaded_jobs=1, store_free_blocks=40),
    )
    m = WorkerMetrics(engine)
    swap = SwapStats(num_blocks_out=4, num_bytes_out=4096, num_blocks_in=2, num_bytes_in=2048,
                     copy_time_s=0.5, num_swap_ins_hidden=1, num_swap_ins_waited=2,
                     failures={"out:store_full": 2, "in:checksum_mismatch": 1})
    m.observe_step(StepOutcome(swap_wait_s=0.25, swap=swap), 0)
    m.observe_step(StepOutcome(swap=SwapStats(num_blocks_out=1, num_bytes_out=1024)), 0)

    def value(name, **labels):
        return m.registry.get_sample_value(name, labels)

    assert value("fastserve:worker_swap_blocks_total", direction="out") == 5
    assert value("fastserve:worker_swap_blocks_total", direction="in") == 2
    assert value("fastserve:worker_swap_bytes_total", direction="out") == 5120
    assert value("fastserve:worker_swap_bytes_total", direction="in") == 2048
    assert value("fastserve:worker_swap_copy_seconds_total") == 0.5
    assert value("fastserve:worker_swap_ins_consumed_total", overlap="hidden") == 1
    assert value("fastserve:worker_swap_ins_consumed_total", overlap="waited") == 2
    assert value("fastserve:worker_swap_failures_total", direction="out", reason="store_full") == 2
    assert value("fastserve:worker_swap_failures_total", direction="in",
                 reason="checksum_mismatch") == 1
    assert value("fastserve:worker_swap_wait_seconds_count") == 2
    assert value("fastserve:worker_swap_wait_seconds_sum") == 0.25
    assert value("fastserve:worker_swap_wait_seconds_bucket", le="0.0") == 1
    assert value("fastserve:worker_jobs_offloaded") == 1
    assert value("fastserve:worker_kvstore_free_blocks") == 40
