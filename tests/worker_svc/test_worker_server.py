"""The worker as a real process behind a real gRPC channel, on a tiny random Llama.

``tiny_llama_dir`` (conftest.py) is a 2-layer model with a 256-token vocabulary and 1024 positions.
"""

from __future__ import annotations

import itertools
import math
import os
import pathlib
import queue
import select
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

import fastserve
from fastserve.proto import worker_pb2 as pb
from fastserve.proto import worker_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parents[2]
NUM_BLOCKS = 64
BLOCK_SIZE = 16
STARTUP_TIMEOUT_S = 90


class Worker:
    """A ``python -m worker_svc`` process on port 0; stderr goes to ``log_path``."""

    def __init__(
        self, model: pathlib.Path, cache: pathlib.Path, log_path: pathlib.Path, *extra: str
    ):
        self.log_path = log_path
        # Tiny models are latency-bound; torch's intra-op threads only contend on a shared box.
        env = {**os.environ, "FASTSERVE_CACHE_DIR": str(cache), "OMP_NUM_THREADS": "1"}
        options = {
            "--model": str(model),
            "--device": "cpu",
            "--dtype": "float32",
            "--num-blocks": str(NUM_BLOCKS),
            "--block-size": str(BLOCK_SIZE),
            "--listen": "127.0.0.1:0",
        }
        argv = [sys.executable, "-m", "worker_svc", *itertools.chain(*options.items()), *extra]
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen(
                argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=log, text=True
            )
        line = self._read_line(STARTUP_TIMEOUT_S)
        assert line.startswith("worker listening on 127.0.0.1:"), (line, self.log())
        self.port = int(line.rsplit(":", 1)[1])
        self.channel = grpc.insecure_channel(f"127.0.0.1:{self.port}")
        grpc.channel_ready_future(self.channel).result(timeout=10)
        self.stub = worker_pb2_grpc.WorkerStub(self.channel)

    def _read_line(self, timeout: float) -> str:
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.proc.kill()
            pytest.fail(f"worker printed nothing within {timeout} s:\n{self.log()}")
        return self.proc.stdout.readline().strip()

    def log(self) -> str:
        return self.log_path.read_text()[-4000:]

    def terminate(self, timeout: float = 10.0) -> int:
        self.channel.close()
        self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


class StepStream:
    """A scheduler's side of the Step stream: one call per iteration."""

    def __init__(self, stub: worker_pb2_grpc.WorkerStub):
        self._requests: queue.Queue[pb.StepRequest | None] = queue.Queue()
        self._responses = stub.Step(iter(self._requests.get, None))
        self._step_id = 0

    def step(self, **fields) -> pb.StepResponse:
        self._step_id += 1
        self._requests.put(pb.StepRequest(step_id=self._step_id, **fields))
        response = next(self._responses)
        assert response.step_id == self._step_id
        return response

    def close(self) -> None:
        """Half-close and wait until the worker has finished the stream."""
        self._requests.put(None)
        assert list(self._responses) == []

    def cancel(self) -> None:
        """Drop the stream the way a crashed scheduler would."""
        self._responses.cancel()


@pytest.fixture(scope="module")
def cache(tmp_path_factory) -> pathlib.Path:
    return tmp_path_factory.mktemp("fastserve-cache")


@pytest.fixture(scope="module")
def worker(tiny_llama_dir, cache, tmp_path_factory) -> Iterator[Worker]:
    w = Worker(tiny_llama_dir, cache, tmp_path_factory.mktemp("logs") / "worker.log")
    yield w
    assert w.terminate() == 0, w.log()


@pytest.fixture
def stream(worker) -> Iterator[StepStream]:
    s = StepStream(worker.stub)
    yield s
    s.close()


def new_job(job_id: int, prompt: list[int], block_ids: list[int]) -> pb.NewJob:
    return pb.NewJob(job_id=job_id, prompt_token_ids=prompt, block_ids=block_ids)


def test_describe(worker, tiny_llama_dir):
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(tiny_llama_dir)
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    d = worker.stub.Describe(pb.DescribeRequest(), timeout=10)
    assert (d.model, d.model_path) == (str(tiny_llama_dir), str(tiny_llama_dir))
    assert (d.dtype, d.device) == ("float32", "cpu")
    assert (d.block_size, d.num_blocks) == (BLOCK_SIZE, NUM_BLOCKS)
    n = cfg.num_hidden_layers
    assert (d.num_layers, d.first_layer, d.end_layer) == (n, 0, n)
    assert (d.num_kv_heads, d.head_dim) == (cfg.num_key_value_heads, head_dim)
    assert d.vocab_size == cfg.vocab_size
    float32_bytes = 4
    assert d.kv_bytes_per_block == (
        n * 2 * BLOCK_SIZE * cfg.num_key_value_heads * head_dim * float32_bytes
    )
    assert d.max_context == cfg.max_position_embeddings
    assert list(d.eos_token_ids) == []
    assert d.worker_version == fastserve.__version__
    assert (d.kvstore_address, d.store_connected, d.store_capacity_blocks) == ("", False, 0)
    assert not d.predictor and not d.arrival_probes  # no predictor for this model


def test_health_serving(worker):
    stub = health_pb2_grpc.HealthStub(worker.channel)
    for service in ("", "fastserve.v1.Worker"):
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        assert reply.status == health_pb2.HealthCheckResponse.SERVING


def test_greedy_tokens_match_transformers_generate(worker, tiny_llama_dir, stream):
    from transformers import LlamaForCausalLM

    num_new = 12
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(0, 256, (n,), generator=g).tolist() for n in (3, 17, 40)]
    hf = LlamaForCausalLM.from_pretrained(tiny_llama_dir).eval()
    expected = []
    for p in prompts:
        out = hf.generate(
            torch.tensor([p]), max_new_tokens=num_new, min_new_tokens=num_new, do_sample=False
        )
        expected.append(out[0, len(p) :].tolist())

    jobs, next_block = [], 0
    for i, p in enumerate(prompts):
        n = math.ceil((len(p) + num_new) / BLOCK_SIZE)
        jobs.append(new_job(i, p, list(range(next_block, next_block + n))))
        next_block += n
    got: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    r = stream.step(
        new_jobs=jobs,
        commands=[pb.JobCommand(job_id=i, num_tokens=len(p)) for i, p in enumerate(prompts)],
    )
    for _ in range(num_new):
        assert not r.errors, r.errors
        assert r.compute_time_s > 0
        assert (r.num_used_blocks, r.num_free_blocks) == (next_block, NUM_BLOCKS - next_block)
        for res in r.results:
            assert res.HasField("token_id") and res.HasField("logprob") and res.logprob <= 0
            got[res.job_id].append(res.token_id)
        if len(got[0]) == num_new:
            break
        r = stream.step(commands=[pb.JobCommand(job_id=i, num_tokens=1) for i in got])
    assert [res.num_computed_tokens for res in r.results] == [len(p) + num_new - 1 for p in prompts]
    assert [got[i] for i in range(len(prompts))] == expected

    r = stream.step(free_job_ids=list(got))
    assert not r.errors and (r.num_used_blocks, r.num_free_blocks) == (0, NUM_BLOCKS)


def test_bad_entries_fail_alone_and_worker_keeps_serving(stream):
    r = stream.step(
        new_jobs=[new_job(1, [5, 6, 7], [0, 1])], commands=[pb.JobCommand(job_id=1, num_tokens=3)]
    )
    assert not r.errors and r.results[0].HasField("token_id")

    r = stream.step(
        new_jobs=[
            new_job(3, [1, 2], [NUM_BLOCKS + 7]),  # block id out of range
            new_job(4, [1, 2], [1]),  # block held by job 1
            new_job(5, [1, 2], list(range(2, NUM_BLOCKS + 1))),  # more blocks than the pool
            new_job(6, list(range(40)), [2]),  # 40 tokens do not fit one block
            new_job(7, [1, 2], list(range(NUM_BLOCKS + 1))),  # more blocks than the pool has
        ],
        commands=[
            pb.JobCommand(job_id=1, num_tokens=1),
            pb.JobCommand(job_id=2, num_tokens=1),
            pb.JobCommand(job_id=6, num_tokens=40),
        ],
    )
    assert [res.job_id for res in r.results] == [1] and r.results[0].HasField("token_id")
    assert r.results[0].num_computed_tokens == 4
    errors = {e.job_id: e for e in r.errors}
    assert sorted(errors) == [2, 3, 4, 5, 6, 7]
    assert errors[2].code == pb.ERROR_CODE_NOT_FOUND and "unknown job 2" in errors[2].message
    assert errors[3].code == pb.ERROR_CODE_INVALID_ARGUMENT
    assert f"block id {NUM_BLOCKS + 7} out of range" in errors[3].message
    assert errors[4].code == pb.ERROR_CODE_FAILED_PRECONDITION
    assert "block id 1 is in use by job 1" in errors[4].message
    assert errors[5].code == pb.ERROR_CODE_RESOURCE_EXHAUSTED
    assert (f"{NUM_BLOCKS - 1} more blocks requested but only {NUM_BLOCKS - 2} of"
            in errors[5].message)
    assert errors[6].code == pb.ERROR_CODE_INVALID_ARGUMENT
    assert "needs 3 blocks for 40 tokens, holds 1" in errors[6].message
    assert errors[7].code == pb.ERROR_CODE_RESOURCE_EXHAUSTED
    assert f"{NUM_BLOCKS + 1} blocks requested; the pool has {NUM_BLOCKS}" in errors[7].message
    assert r.num_used_blocks == 3  # job 1's two blocks and job 6's one; nothing else claimed

    r = stream.step(
        commands=[pb.JobCommand(job_id=1, num_tokens=1), pb.JobCommand(job_id=6, num_tokens=16)],
        free_job_ids=[3],
    )
    assert [(e.job_id, e.code) for e in r.errors] == [(3, pb.ERROR_CODE_NOT_FOUND)]
    assert [(res.job_id, res.num_computed_tokens) for res in r.results] == [(1, 5), (6, 16)]
    assert r.results[0].HasField("token_id") and not r.results[1].HasField("token_id")
    r = stream.step(free_job_ids=[1, 6])
    assert not r.errors and r.num_used_blocks == 0


def test_swaps_without_a_kvstore_fail_per_job(stream):
    r = stream.step(
        new_jobs=[new_job(1, [5, 6, 7], [0])], commands=[pb.JobCommand(job_id=1, num_tokens=3)]
    )
    assert not r.errors
    r = stream.step(
        swap_out=[pb.SwapOut(job_id=1), pb.SwapOut(job_id=8)],
        swap_in=[pb.SwapIn(job_id=1, block_ids=[3])],
        commands=[pb.JobCommand(job_id=1, num_tokens=1)],
    )
    errors = [(e.job_id, e.code) for e in r.errors]
    assert errors == [
        (1, pb.ERROR_CODE_UNAVAILABLE),
        (8, pb.ERROR_CODE_NOT_FOUND),
        (1, pb.ERROR_CODE_FAILED_PRECONDITION),  # a SwapIn of a job that is on the device
    ]
    assert "no kvstore configured" in r.errors[0].message
    assert r.swap.failures == {"out:no_store": 1}
    # Job 1 was left alone and still runs.
    assert [res.job_id for res in r.results] == [1] and r.results[0].num_computed_tokens == 4
    assert r.num_used_blocks == 1 and r.swap_wait_s == 0
    stream.step(free_job_ids=[1])


def test_one_scheduler_at_a_time_and_disconnect_frees_jobs(worker):
    first = StepStream(worker.stub)
    r = first.step(
        new_jobs=[new_job(1, [1, 2, 3], [0, 1, 2, 3])],
        commands=[pb.JobCommand(job_id=1, num_tokens=3)],
    )
    assert not r.errors and r.num_used_blocks == 4

    second = StepStream(worker.stub)
    with pytest.raises(grpc.RpcError) as refused:
        second.step()
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert "another scheduler is attached" in refused.value.details()

    first.cancel()
    third = StepStream(worker.stub)
    r = third.step(
        new_jobs=[new_job(1, [1, 2, 3], [0, 1, 2, 3])],
        commands=[pb.JobCommand(job_id=1, num_tokens=3)],
    )
    assert not r.errors and r.num_used_blocks == 4
    third.close()

    fourth = StepStream(worker.stub)
    assert fourth.step().num_used_blocks == 0
    fourth.close()


def test_profile_is_measured_once_then_cached(worker, tiny_llama_dir, cache, tmp_path):
    first = worker.stub.Profile(pb.ProfileRequest(), timeout=120)
    assert not first.cached and first.cache_key
    # Context 128 plus the measured iterations needs 10 blocks per job: 64 blocks fit 6 jobs.
    assert [p.batch_size for p in first.decode] == [1, 2, 4]
    assert all(128 <= p.context_len < 150 and p.time_s > 0 for p in first.decode)
    assert [p.num_tokens for p in first.prefill] == [16, 32, 64, 128, 256, 512]
    assert first.prefill[-1].time_s > first.prefill[0].time_s > 0
    path = cache / "profiles" / f"{first.cache_key}.json"
    mtime = path.stat().st_mtime_ns

    again = worker.stub.Profile(pb.ProfileRequest(), timeout=10)
    assert again.cached and list(again.prefill) == list(first.prefill)

    stream = StepStream(worker.stub)
    stream.step(new_jobs=[new_job(1, [1], [0])])
    with pytest.raises(grpc.RpcError) as busy:
        worker.stub.Profile(pb.ProfileRequest(force=True), timeout=10)
    assert busy.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    stream.close()

    other = Worker(tiny_llama_dir, cache, tmp_path / "second.log", "--profile-at-start")
    try:
        cached = other.stub.Profile(pb.ProfileRequest(), timeout=10)
    finally:
        start = time.monotonic()
        assert other.terminate() == 0, other.log()
        assert time.monotonic() - start < 5
    assert cached.cached and cached.cache_key == first.cache_key
    assert list(cached.decode) == list(first.decode)
    assert list(cached.prefill) == list(first.prefill)
    assert path.stat().st_mtime_ns == mtime
