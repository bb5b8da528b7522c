"""Clusters of real processes for the scheduler's end-to-end tests.

``smol_cluster``: a worker with the default model (SmolLM2-135M) and an FCFS scheduler;
``tiny_cluster``: the same around ``tiny_tok_model`` (tests/conftest.py), one per test.
"""

from __future__ import annotations

import grpc
import pytest
from procs import start_scheduler, start_worker

from fastserve.proto import scheduler_pb2_grpc


class Cluster:
    def __init__(self, worker, scheduler):
        self.worker = worker
        self.scheduler = scheduler
        self.channel = grpc.insecure_channel(scheduler.address)
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)

    def close(self):
        self.channel.close()
        self.scheduler.stop()
        self.worker.stop()


@pytest.fixture(scope="module")
def smol_cluster(default_model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("smol-cluster")
    worker = start_worker(str(default_model_dir), logs, 1024)
    try:
        scheduler = start_scheduler(str(default_model_dir), [worker.address], logs)
    except Exception:
        worker.stop()
        raise
    cluster = Cluster(worker, scheduler)
    yield cluster
    cluster.close()


@pytest.fixture()
def tiny_cluster(tiny_tok_model, tmp_path):
    """A fresh cluster per test: tests here kill and overload it."""
    worker = start_worker(str(tiny_tok_model), tmp_path, 256)
    try:
        scheduler = start_scheduler(str(tiny_tok_model), [worker.address], tmp_path,
                                    "--max-waiting", "4", "--max-batch-size", "4")
    except Exception:
        worker.stop()
        raise
    cluster = Cluster(worker, scheduler)
    yield cluster
    cluster.close()
