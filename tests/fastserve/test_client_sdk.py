"""The client SDK and the client CLI against ``ScriptedScheduler``, an in-test gRPC double.

``ScriptedScheduler`` is not the scheduler: it answers every Generate from a fixed script
chosen by the prompt, so that these tests pin down the SDK's own behaviour (request building,
status-code mapping, deadlines, cancellation) and the CLI's output contract.
"""

from __future__ import annotations

import asyncio
import json
import os
import pathlib
import subprocess
import sys
import threading
import time
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from procs import free_port

from fastserve import errors
from fastserve.client import HEALTH_SERVICE, AsyncClient, Client
from fastserve.proto import scheduler_pb2 as pb
from fastserve.proto import scheduler_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHUNKS = ["Hello", ",", " wor", "ld!"]
TEXT = "".join(CHUNKS)


class ScriptedScheduler(scheduler_pb2_grpc.SchedulerServicer):
    """Prompts: "slow" streams until cancelled; "fail" ends with finish reason ERROR;
    "abort:<CODE>:<details>" fails with that status; anything else streams ``CHUNKS``."""

    def __init__(self) -> None:
        self.requests: list[pb.GenerateRequest] = []
        self.client_cancelled = threading.Event()  # a stream the client closed or timed out
        self.live: dict[str, threading.Event] = {}  # request id -> set by Cancel

    def Generate(self, request, context):
        self.requests.append(request)
        rid = request.request_id or "server-id"
        prompt = request.chat.messages[-1].content if request.HasField("chat") else request.text
        if prompt.startswith("abort:"):
            _, code, details = prompt.split(":", 2)
            context.abort(grpc.StatusCode[code], details)
        cancel = self.live.setdefault(rid, threading.Event())
        # Runs when the RPC ends however it ends; the server just stops pulling from this
        # generator when the client goes away, so the generator itself may never notice.
        ended = threading.Event()
        context.add_callback(lambda: ended.is_set() or self.client_cancelled.set())
        try:
            if prompt == "slow":
                for i in range(2000):
                    if cancel.is_set():
                        ended.set()
                        yield _final(rid, pb.FINISH_REASON_CANCELLED)
                        return
                    yield pb.GenerateResponse(request_id=rid,
                                              chunk=pb.Chunk(text=".", token_ids=[i]))
                    time.sleep(0.02)
            for i, text in enumerate(CHUNKS):
                yield pb.GenerateResponse(
                    request_id=rid, chunk=pb.Chunk(text=text, token_ids=[10 + i], logprobs=[-0.5]))
            ended.set()
            if prompt == "fail":
                yield _final(rid, pb.FINISH_REASON_ERROR, error_message="worker lost")
            else:
                yield _final(rid, pb.FINISH_REASON_STOP, stop_string="\n\n")
        finally:
            self.live.pop(rid, None)

    def Cancel(self, request, context):
        event = self.live.get(request.request_id)
        if event is not None:
            event.set()
        return pb.CancelResponse(found=event is not None)

    def Status(self, request, context):
        worker = pb.WorkerStatus(address="127.0.0.1:50061", state="ready", healthy=True,
                                 model="tiny", num_blocks=256, num_used_blocks=128, kv_usage=0.5,
                                 num_iterations=12345678901)
        return pb.StatusResponse(policy="fcfs", queues=[pb.QueueStatus(name="fcfs", num_jobs=2)],
                                 num_running=1, num_waiting=2, workers=[worker], max_waiting=64,
                                 model="tiny")


def _final(rid: str, reason: int, **kw) -> pb.GenerateResponse:
    usage = pb.Usage(prompt_tokens=7, completion_tokens=4, queue_time_s=0.01,
                     time_to_first_token_s=0.02, total_time_s=0.05)
    return pb.GenerateResponse(request_id=rid,
                               final=pb.Final(finish_reason=reason, usage=usage, **kw))


@pytest.fixture(scope="module")
def server():
    servicer = ScriptedScheduler()
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    scheduler_pb2_grpc.add_SchedulerServicer_to_server(servicer, srv)
    health_servicer = health.HealthServicer()
    health_servicer.set(HEALTH_SERVICE, health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    yield servicer, f"127.0.0.1:{port}"
    srv.stop(0)


@pytest.fixture
def scheduler(server):
    servicer = server[0]
    servicer.requests.clear()
    servicer.client_cancelled.clear()
    return servicer


@pytest.fixture
def client(server):
    with Client(server[1], timeout=10) as c:
        yield c


def test_generate_collects_chunks_into_a_completion(client, scheduler):
    c = client.generate("hi", request_id="r-1")
    assert (c.request_id, c.text, c.token_ids) == ("r-1", TEXT, [10, 11, 12, 13])
    assert (c.finish_reason, c.stop_string, c.error) == ("stop", "\n\n", "")
    assert c.usage.prompt_tokens == 7 and c.usage.completion_tokens == 4
    assert c.usage.total_time_s == pytest.approx(0.05)


def test_request_carries_only_the_options_given(client, scheduler):
    client.generate(messages=[{"role": "user", "content": "hi"}], temperature=0.0, stop="END")
    req = scheduler.requests[-1]
    assert [m.role for m in req.chat.messages] == ["user"] and req.chat.add_generation_prompt
    assert req.sampling.HasField("temperature") and req.sampling.temperature == 0.0
    assert not req.sampling.HasField("max_tokens") and not req.sampling.HasField("seed")
    assert list(req.sampling.stop) == ["END"] and req.request_id  # the SDK made an id
    client.generate([1, 2, 3], max_tokens=5, seed=7, ignore_eos=True)
    req = scheduler.requests[-1]
    assert list(req.token_ids.ids) == [1, 2, 3] and req.sampling.max_tokens == 5
    assert req.sampling.seed == 7 and req.sampling.ignore_eos
    with pytest.raises(ValueError):
        client.generate("a", messages=[{"role": "user", "content": "b"}])


@pytest.mark.parametrize("code, exc", [
    ("INVALID_ARGUMENT", errors.InvalidArgument),
    ("RESOURCE_EXHAUSTED", errors.ResourceExhausted),
    ("UNAVAILABLE", errors.Unavailable),
    ("NOT_FOUND", errors.NotFound),
    ("INTERNAL", errors.FastServeError),
])
def test_status_codes_become_typed_exceptions(client, scheduler, code, exc):
    with pytest.raises(exc) as info:
        client.generate(f"abort:{code}:max_tokens must be <= 2048")
    assert info.value.code == grpc.StatusCode[code]
    assert info.value.details == "max_tokens must be <= 2048"
    assert isinstance(info.value.__cause__, grpc.RpcError)


def test_deadline_raises_deadline_exceeded_and_cancels(client, scheduler):
    with pytest.raises(errors.DeadlineExceeded):
        client.generate("slow", timeout=0.3)
    assert scheduler.client_cancelled.wait(5)


def test_closing_a_stream_cancels_the_request(client, scheduler):
    with client.stream("slow") as stream:
        first = next(stream)
        assert first.text == "." and first.request_id == stream.request_id
    assert scheduler.client_cancelled.wait(5)
    assert list(stream) == [] and stream.completion is None


def test_cancel_by_id_ends_the_stream_as_cancelled(client, scheduler):
    stream = client.stream("slow", request_id="to-cancel")
    next(stream)
    assert client.cancel("to-cancel")
    list(stream)  # chunks sent before the Cancel arrived, then the final message
    assert stream.completion.finish_reason == "cancelled"
    assert not client.cancel("no-such-request")


def test_error_finish_is_returned_not_raised(client, scheduler):
    c = client.generate("fail")
    assert (c.finish_reason, c.error, c.text) == ("error", "worker lost", TEXT)


def test_status_health_and_wait_ready(client, scheduler):
    status = client.status()
    assert status["policy"] == "fcfs" and status["num_finished"] == 0  # zeros are kept
    assert status["workers"][0]["kv_usage"] == 0.5
    assert int(status["workers"][0]["num_iterations"]) == 12345678901
    assert client.health()
    client.wait_ready(timeout=5)


def test_unreachable_scheduler(unused_port):
    with Client(f"127.0.0.1:{unused_port}", timeout=5) as c:
        assert not c.health()
        with pytest.raises(errors.Unavailable):
            c.generate("hi")
        with pytest.raises(errors.Unavailable):
            c.wait_ready(timeout=0.5)


def test_async_client(server, scheduler):
    async def main():
        async with AsyncClient(server[1], timeout=10) as c:
            completion = await c.generate("hi")
            chunks = [chunk.text async for chunk in c.stream("hi")]
            with pytest.raises(errors.ResourceExhausted):
                await c.generate("abort:RESOURCE_EXHAUSTED:waiting queue full (64)")
            with pytest.raises(errors.DeadlineExceeded):
                await c.generate("slow", timeout=0.3)
            assert await asyncio.to_thread(scheduler.client_cancelled.wait, 5)
            scheduler.client_cancelled.clear()
            async with c.stream("slow") as stream:
                await stream.__anext__()
            assert await asyncio.to_thread(scheduler.client_cancelled.wait, 5)
            return completion, chunks, await c.status(), await c.health()

    completion, chunks, status, healthy = asyncio.run(main())
    assert completion.text == TEXT and chunks == CHUNKS
    assert status["model"] == "tiny" and healthy


def _cli(*args: str, stdin: str | None = None, env: dict | None = None):
    base = {k: v for k, v in os.environ.items() if k != "FASTSERVE_ADDRESS"}
    return subprocess.run([sys.executable, "-m", "fastserve.cli", *args], input=stdin,
                          env={**base, **(env or {})},
                          capture_output=True, text=True, check=False, timeout=60, cwd=ROOT)


def test_cli_generate_prints_only_the_text(server, scheduler):
    r = _cli("generate", "hi", "--address", server[1], "--temperature", "0", "--stop", "x")
    assert (r.returncode, r.stdout, r.stderr) == (0, TEXT + "\n", "")
    assert list(scheduler.requests[-1].sampling.stop) == ["x"]
    r = _cli("generate", "hi", "--chat", "-v", env={"FASTSERVE_ADDRESS": server[1]})
    assert r.returncode == 0 and r.stdout == TEXT + "\n" and "[stop]" in r.stderr
    assert scheduler.requests[-1].chat.messages[0].content == "hi"


def test_cli_generate_errors(server, scheduler):
    r = _cli("generate", "abort:INVALID_ARGUMENT:top_p must be in (0, 1]", "--address", server[1])
    assert (r.returncode, r.stdout) == (2, "")
    assert r.stderr == "error: INVALID_ARGUMENT: top_p must be in (0, 1]\n"
    r = _cli("generate", "fail", "--address", server[1])
    assert r.returncode == 1 and r.stdout == TEXT + "\n" and "worker lost" in r.stderr


def test_cli_chat_keeps_the_conversation_when_piped(server, scheduler):
    r = _cli("chat", "--address", server[1], "--system", "be brief",
             stdin="hi\nagain\n/reset\nnew\n")
    assert (r.returncode, r.stdout) == (0, (TEXT + "\n") * 3)
    roles = [[m.role for m in req.chat.messages] for req in scheduler.requests[-3:]]
    assert roles == [["system", "user"], ["system", "user", "assistant", "user"],
                     ["system", "user"]]


def test_cli_status(server, scheduler):
    r = _cli("status", "--json", "--address", server[1])
    assert r.returncode == 0 and json.loads(r.stdout)["num_waiting"] == 2
    r = _cli("status", "--address", server[1])
    assert r.returncode == 0
    assert "127.0.0.1:50061" in r.stdout and "128/256 (50.0%)" in r.stdout and "fcfs" in r.stdout


@pytest.fixture
def unused_port():
    return free_port()
