"""The output-length predictor across the services: a worker started with an artifact
predicts, the scheduler ranks by it and reports it (Final, Status, metrics); a client's
length hint reaches the job."""

from __future__ import annotations

import math

import grpc
import pytest
import torch
from procs import free_port, scrape_metrics, start_scheduler, start_worker

from fastserve.proto import scheduler_pb2 as spb
from fastserve.proto import scheduler_pb2_grpc
from worker_svc.predictor import FORMAT

HIDDEN = 32  # tiny_tok_model


def _cluster(tiny_tok_model, tmp_path, *scheduler_args, num_blocks=256):
    f = HIDDEN + 2
    artifact = {"format": FORMAT, "hidden_size": HIDDEN, "layer": 1, "refresh": 8,
                "mean": torch.zeros(f), "std": torch.ones(f), "w1": torch.zeros(f, 4),
                "b1": torch.zeros(4), "w2": torch.zeros(4, 1),
                "b2": torch.tensor([math.log(10.0)]), "info": {}}  # always 9 to come
    path = tmp_path / "predictor.pt"
    torch.save(artifact, path)
    worker = start_worker(str(tiny_tok_model), tmp_path, num_blocks, "worker", "--predictor",
                          str(path))
    port = free_port()
    try:
        scheduler = start_scheduler(str(tiny_tok_model), [worker.address], tmp_path,
                                    "--policy", "predictive", "--metrics-port", str(port),
                                    *scheduler_args)
    except Exception:
        worker.stop()
        raise
    channel = grpc.insecure_channel(scheduler.address)
    yield scheduler_pb2_grpc.SchedulerStub(channel), port, scheduler.address
    channel.close()
    scheduler.stop()
    worker.stop()


@pytest.fixture()
def predicting_cluster(tiny_tok_model, tmp_path):
    yield from _cluster(tiny_tok_model, tmp_path)


def test_predictions_reach_final_status_and_metrics(predicting_cluster):
    stub, port, address = predicting_cluster
    req = spb.GenerateRequest(token_ids=spb.TokenIds(ids=[5, 6, 7, 8]), request_id="p",
                              sampling=spb.SamplingOptions(max_tokens=20, temperature=0.0,
                                                           ignore_eos=True))
    (final,) = [r.final for r in stub.Generate(req, timeout=60) if r.HasField("final")]
    assert final.usage.completion_tokens == 20
    assert final.predicted_output_tokens == pytest.approx(10.0, abs=1e-3)  # 1 made + 9
    status = stub.Status(spb.StatusRequest(), timeout=10)
    w = status.workers[0]
    assert w.predictor.startswith("predictor.pt (layer 1")
    assert w.predictor.endswith("a loop after 32 repeated tokens)")  # the worker's default
    assert w.num_predicted == 1 and w.prediction_mae_tokens == pytest.approx(10.0, abs=1e-3)
    from fastserve.cli_client import format_status
    from fastserve.client import Client

    with Client(address) as client:
        shown = format_status(client.status())
    assert "length predictors:" in shown and "1 answers predicted, MAE 10.0 tokens" in shown
    samples = scrape_metrics(port)
    assert samples[("fastserve:prediction_error_tokens_count", frozenset())] == 1
    assert samples[("fastserve:prediction_error_tokens_sum", frozenset())] == pytest.approx(
        10.0, abs=1e-3)


def test_jobs_that_wait_are_estimated_at_arrival_and_finish_as_alone(tiny_tok_model, tmp_path):
    """Three blocks of 16 tokens, 20-token prompts, four requests at once: one job holds two
    blocks, the others wait for memory and are probed (the worker's Describe says it answers
    probes), and every answer is the one it gets alone."""
    import concurrent.futures

    cluster = _cluster(tiny_tok_model, tmp_path, "--max-batch-size", "1", num_blocks=3)
    stub, port, _ = next(cluster)
    try:
        def run(i):
            req = spb.GenerateRequest(
                token_ids=spb.TokenIds(ids=[5 + i, *range(6, 25)]), request_id=f"r{i}",
                sampling=spb.SamplingOptions(max_tokens=12, temperature=0.0, ignore_eos=True))
            return [t for r in stub.Generate(req, timeout=60) if r.HasField("chunk")
                    for t in r.chunk.token_ids]

        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            together = list(pool.map(run, range(4)))
        samples = scrape_metrics(port)
        probes = sum(v for (name, _), v in samples.items()
                     if name == "fastserve:num_arrival_probes_total")
        assert probes >= 1
        status = stub.Status(spb.StatusRequest(), timeout=10)
        assert status.workers[0].num_probes == probes
        assert together == [run(i) for i in range(4)]
        assert all(len(t) == 12 for t in together)
    finally:
        next(cluster, None)


def test_a_clients_length_hint_reaches_the_job(tiny_tok_model):
    from scheduler_svc.api.requests import build_job
    from scheduler_svc.api.text import TextModel

    text = TextModel.load(str(tiny_tok_model))

    def job(**kw):
        req = spb.GenerateRequest(token_ids=spb.TokenIds(ids=[5, 6]), **kw)
        return build_job(req, job_id=1, request_id="r", now=0.0, text=text, vocab_size=1000,
                         max_context=100, default_max_tokens=16, eos_token_ids=frozenset())[0]

    assert job(output_length_hint=42).output_length_hint == 42
    assert job().output_length_hint is None
    assert job(output_length_hint=0).output_length_hint is None
