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


def start_cluster(model, logs, num_blocks, *scheduler_args) -> Cluster:
    worker = start_worker(str(model), logs, num_blocks)
    try:
        scheduler = start_scheduler(str(model), [worker.address], logs, *scheduler_args)
    except Exception:
        worker.stop()
        raise
    return Cluster(worker, scheduler)


@pytest.fixture(scope="module")
def smol_cluster(default_model_dir, tmp_path_factory):
    cluster = start_cluster(default_model_dir, tmp_path_factory.mktemp("smol-cluster"), 1024)
    yield cluster
    cluster.close()


@pytest.fixture()
def tiny_cluster(tiny_tok_model, tmp_path):
    """A fresh cluster per test: tests here kill and overload it."""
    cluster = start_cluster(tiny_tok_model, tmp_path, 256, "--max-waiting", "4",
                            "--max-batch-size", "4", "--worker-loss-wait-s", "1")
    yield cluster
    cluster.close()
