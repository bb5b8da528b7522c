"""Cancellation, client disconnects, bad input, overload and a lost worker, through real
processes and real gRPC (tiny random model with SmolLM2's tokenizer)."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from fastserve.proto import scheduler_pb2 as spb
from fastserve.proto import scheduler_pb2_grpc


def long_request(request_id="", max_tokens=400):
    return spb.GenerateRequest(
        text="count with me", request_id=request_id,
        sampling=spb.SamplingOptions(max_tokens=max_tokens, temperature=0.0, ignore_eos=True),
    )


def collect(stream):
    ids, final = [], None
    for msg in stream:
        if msg.HasField("chunk"):
            ids += list(msg.chunk.token_ids)
        else:
            final = msg.final
    return ids, final


def in_background(fn, *args):
    box = {}

    def run():
        try:
            box["value"] = fn(*args)
        except Exception as e:  # noqa: BLE001 - handed to the test
            box["error"] = e

    t = threading.Thread(target=run)
    t.start()
    return t, box


def wait_until(pred, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return True
        time.sleep(0.05)
    return False


def used_blocks(cluster):
    return sum(w.num_used_blocks for w in cluster.stub.Status(spb.StatusRequest()).workers)


def test_cancel_by_id_and_disconnect_stop_within_an_iteration(tiny_cluster):
    stub = tiny_cluster.stub
    normal = [in_background(lambda: collect(stub.Generate(long_request(max_tokens=60))))
              for _ in range(2)]
    cancelled = stub.Generate(long_request("cancel-me"))
    first = next(cancelled)
    assert first.HasField("chunk")
    assert stub.Cancel(spb.CancelRequest(request_id="cancel-me")).found
    ids, final = collect(cancelled)
    assert final.finish_reason == spb.FINISH_REASON_CANCELLED
    assert final.usage.completion_tokens < 400
    assert not stub.Cancel(spb.CancelRequest(request_id="cancel-me")).found

    gone = stub.Generate(long_request("walk-away"))
    next(gone)
    gone.cancel()  # the client closes its stream
    for t, box in normal:
        t.join(60)
        ids, final = box["value"]
        assert len(ids) == 60 and final.finish_reason == spb.FINISH_REASON_LENGTH
    assert wait_until(lambda: used_blocks(tiny_cluster) == 0)
    status = stub.Status(spb.StatusRequest())
    assert status.num_running == 0 and status.num_waiting == 0


BAD = [
    (spb.GenerateRequest(text=""), "text"),
    (spb.GenerateRequest(token_ids=spb.TokenIds(ids=[])), "token_ids.ids"),
    (spb.GenerateRequest(text="word " * 3000), "prompt: "),
    (spb.GenerateRequest(text="hi", sampling=spb.SamplingOptions(max_tokens=0)),
     "sampling.max_tokens must be in [1, "),
    (spb.GenerateRequest(text="hi", sampling=spb.SamplingOptions(max_tokens=10**6)),
     "sampling.max_tokens must be in [1, "),
    (spb.GenerateRequest(text="hi", sampling=spb.SamplingOptions(temperature=-1)),
     "sampling.temperature must be in [0, 100]"),
    (spb.GenerateRequest(text="hi", sampling=spb.SamplingOptions(temperature=float("nan"))),
     "sampling.temperature must be in [0, 100]"),
    (spb.GenerateRequest(text="x" * 3_900_000), "text: 3900000 bytes; the limit is"),
    (spb.GenerateRequest(text="hi", request_id="r" * 3_900_000),
     "request_id: 3900000 characters; the limit is 256"),
    (spb.GenerateRequest(token_ids=spb.TokenIds(ids=[5] * 1_000_000)),
     "token_ids.ids: 1000000 tokens; the limit is"),
    (spb.GenerateRequest(chat=spb.ChatMessages(messages=[
        spb.ChatMessage(role="user", content="hi")] * 2000)),
     "chat.messages: 2000 messages; the limit is 1024"),
    (spb.GenerateRequest(text="hi", sampling=spb.SamplingOptions(top_p=0)),
     "sampling.top_p must be in (0, 1]"),
    (spb.GenerateRequest(text="hi", sampling=spb.SamplingOptions(top_p=1.5)),
     "sampling.top_p must be in (0, 1]"),
    (spb.GenerateRequest(text="hi", sampling=spb.SamplingOptions(top_k=-2)),
     "sampling.top_k must be in [0, "),
    (spb.GenerateRequest(token_ids=spb.TokenIds(ids=[5, 10**7])), "token_ids.ids[1] = 10000000"),
    (spb.GenerateRequest(text="hi", sampling=spb.SamplingOptions(stop=["x"] * 100)),
     "sampling.stop"),
    (spb.GenerateRequest(chat=spb.ChatMessages(messages=[
        spb.ChatMessage(role="user", content="hi"), spb.ChatMessage(role="wizard", content="x")])),
     "chat.messages[1].role"),
]


def test_bad_input_is_named_and_disturbs_nothing(tiny_cluster):
    stub = tiny_cluster.stub
    inflight = [in_background(lambda: collect(stub.Generate(long_request(max_tokens=40))))
                for _ in range(2)]
    for req, needle in BAD:
        with pytest.raises(grpc.RpcError) as err:
            list(stub.Generate(req))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, needle
        assert needle in err.value.details(), (needle, err.value.details())
    for t, box in inflight:
        t.join(60)
        ids, final = box["value"]
        assert len(ids) == 40 and final.finish_reason == spb.FINISH_REASON_LENGTH
    assert wait_until(lambda: used_blocks(tiny_cluster) == 0)


def test_invalid_utf8_is_invalid_argument_not_unknown(tiny_cluster):
    field = spb.GenerateRequest.DESCRIPTOR.fields_by_name["text"].number
    raw = bytes([field << 3 | 2, 3]) + b"\xff\xfeA"  # a length-delimited text of bad UTF-8
    generate = tiny_cluster.channel.unary_stream(
        "/fastserve.v1.Scheduler/Generate", request_serializer=lambda b: b,
        response_deserializer=spb.GenerateResponse.FromString)
    with pytest.raises(grpc.RpcError) as err:
        list(generate(raw))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "UTF-8" in err.value.details() and "Generate" in err.value.details()
    cancel = tiny_cluster.channel.unary_unary(
        "/fastserve.v1.Scheduler/Cancel", request_serializer=lambda b: b,
        response_deserializer=spb.CancelResponse.FromString)
    with pytest.raises(grpc.RpcError) as err:
        cancel(bytes([1 << 3 | 2, 2]) + b"\xc3\x28")
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    ids, _ = collect(tiny_cluster.stub.Generate(long_request(max_tokens=5)))
    assert len(ids) == 5  # the service is unharmed


def test_a_vanishing_temperature_samples_greedily_and_harms_no_batch_mate(tiny_cluster):
    """1e-45 once passed validation, made the sampler's numbers infinite and ended every
    stream of its batch with an error."""
    stub = tiny_cluster.stub
    prompts = ["count with me", "tell me a story", "the sky is"]

    def run(prompt, temperature):
        return collect(stub.Generate(spb.GenerateRequest(text=prompt, sampling=spb.SamplingOptions(
            max_tokens=30, temperature=temperature, ignore_eos=True))))

    solo = [run(p, 0.0)[0] for p in prompts]
    together = [in_background(run, p, 1e-45 if i == 0 else 0.0) for i, p in enumerate(prompts)]
    for (t, box), expect in zip(together, solo, strict=True):
        t.join(60)
        ids, final = box["value"]
        assert final.finish_reason == spb.FINISH_REASON_LENGTH and ids == expect


def test_full_waiting_queue_is_refused_at_once(tiny_cluster):
    stub = tiny_cluster.stub
    # max batch 4 and max waiting 4: 4 run, 4 wait, the 9th is refused.
    streams = [stub.Generate(long_request(max_tokens=2000)) for _ in range(4)]
    assert wait_until(lambda: stub.Status(spb.StatusRequest()).num_running == 4)
    streams += [stub.Generate(long_request(max_tokens=2000)) for _ in range(4)]
    assert wait_until(lambda: stub.Status(spb.StatusRequest()).num_waiting == 4)
    start = time.monotonic()
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(long_request(max_tokens=5)))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "waiting queue is full (4 requests)" in err.value.details()
    assert time.monotonic() - start < 5
    for s in streams:
        s.cancel()
    assert wait_until(lambda: used_blocks(tiny_cluster) == 0)


def test_killed_worker_fails_streams_with_unavailable(tiny_cluster):
    """With no worker to move to and none back within --worker-loss-wait-s (1 s here)."""
    stub = tiny_cluster.stub
    streams = [stub.Generate(long_request(max_tokens=2000)) for _ in range(3)]
    for s in streams:
        next(s)
    tiny_cluster.worker.kill()
    start = time.monotonic()
    for s in streams:
        with pytest.raises(grpc.RpcError) as err:
            collect(s)
        assert err.value.code() == grpc.StatusCode.UNAVAILABLE
        # Written for the client: no internal error repr (it once carried the channel's
        # whole debug string).
        details = err.value.details()
        assert "unavailable" in details and len(details) < 300, details
        assert "debug_error_string" not in details and "AioRpcError" not in details
    assert time.monotonic() - start < 10
    status = stub.Status(spb.StatusRequest(), timeout=5)
    assert [w.state for w in status.workers] in (["failed"], ["connecting"])
    assert not status.workers[0].healthy
    with pytest.raises(grpc.RpcError) as err:
        list(stub.Generate(long_request(max_tokens=5)))
    assert err.value.code() == grpc.StatusCode.UNAVAILABLE


@pytest.mark.parametrize("num_blocks", [256, 40])
def test_a_worker_lost_while_idle_is_noticed_and_its_restart_is_re_described(
        tiny_cluster, tiny_tok_model, tmp_path, num_blocks):
    """Killed while idle, the worker was once still "ready" (health SERVING) until the next
    request failed; restarted with a smaller pool, the scheduler kept the old one and sent
    block ids past its end."""
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from procs import start_worker

    stub = tiny_cluster.stub
    health = health_pb2_grpc.HealthStub(tiny_cluster.channel)

    def serving():
        return health.Check(health_pb2.HealthCheckRequest(), timeout=5).status

    def worker():
        return stub.Status(spb.StatusRequest(), timeout=5).workers[0]

    assert len(collect(stub.Generate(long_request(max_tokens=5)))[0]) == 5
    port = tiny_cluster.worker.address.rsplit(":", 1)[1]
    tiny_cluster.worker.kill()
    assert wait_until(lambda: not worker().healthy, 10)
    assert wait_until(lambda: serving() == health_pb2.HealthCheckResponse.NOT_SERVING, 10)
    tiny_cluster.worker = start_worker(str(tiny_tok_model), tmp_path, num_blocks, "restarted",
                                       "--listen", f"127.0.0.1:{port}")
    assert wait_until(lambda: worker().healthy, 60)
    assert worker().num_blocks == num_blocks
    assert wait_until(lambda: serving() == health_pb2.HealthCheckResponse.SERVING, 10)
    runs = [in_background(lambda: collect(stub.Generate(long_request(max_tokens=120))))
            for _ in range(4)]
    for t, box in runs:
        t.join(120)
        assert "error" not in box, box.get("error")
        ids, final = box["value"]
        assert len(ids) == 120 and final.finish_reason == spb.FINISH_REASON_LENGTH


def test_a_worker_serving_another_model_is_refused(tiny_tok_model, default_model_dir, tmp_path):
    from procs import start_scheduler, start_worker

    worker = start_worker(str(tiny_tok_model), tmp_path, 64)
    try:
        with pytest.raises(RuntimeError, match="did not become ready") as err:
            start_scheduler(str(default_model_dir), [worker.address], tmp_path,
                            "--connect-timeout", "30")
        assert "start both with the same --model" in str(err.value)
    finally:
        worker.stop()


def test_a_worker_too_small_to_time_a_decode_is_refused_by_name(tiny_tok_model, tmp_path):
    """A policy with a cost model needs the worker's decode times; a pool that cannot hold
    one job to time them is named, with what to change."""
    from procs import start_scheduler, start_worker

    worker = start_worker(str(tiny_tok_model), tmp_path, 1, "worker", "--block-size", "8")
    try:
        with pytest.raises(RuntimeError, match="did not become ready") as err:
            start_scheduler(str(tiny_tok_model), [worker.address], tmp_path,
                            "--policy", "skip-join-mlfq", "--connect-timeout", "30")
        assert "(1 blocks of 8 tokens) cannot hold one job to time a decode" in str(err.value)
        assert "--num-blocks" in str(err.value)
    finally:
        worker.stop()


def test_api_keys_authenticate_clients_and_own_their_requests(tiny_tok_model, tmp_path):
    from procs import start_scheduler, start_worker

    from fastserve.client import Client
    from fastserve.errors import Unauthenticated

    alice, bob = "alice-key-0123456789abcdef", "bob-key-0123456789abcdef"
    keys = tmp_path / "keys"
    keys.write_text(f"# clients\n{alice}\n\n{bob}\n")
    worker = start_worker(str(tiny_tok_model), tmp_path, 256)
    scheduler = start_scheduler(str(tiny_tok_model), [worker.address], tmp_path,
                                "--api-keys", str(keys))
    channel = grpc.insecure_channel(scheduler.address)
    try:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        for metadata in (None, (("authorization", "Bearer wrong-key-0123456789abc"),),
                         (("authorization", alice),)):  # no "Bearer"
            with pytest.raises(grpc.RpcError) as err:
                list(stub.Generate(long_request(max_tokens=3), metadata=metadata))
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "authorization: Bearer <key>" in err.value.details()
            with pytest.raises(grpc.RpcError) as err:
                stub.Status(spb.StatusRequest(), metadata=metadata)
            assert err.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with Client(scheduler.address) as anonymous, pytest.raises(Unauthenticated):
            anonymous.generate("hi", max_tokens=2)
        with Client(scheduler.address, api_key=alice) as a, \
                Client(scheduler.address, api_key=bob) as b:
            stream = a.stream("count with me", max_tokens=300, temperature=0.0,
                              ignore_eos=True, request_id="alices")
            next(iter(stream))
            assert not b.cancel("alices")  # not bob's: as if unknown
            assert b.status()["num_running"] == 1
            assert a.cancel("alices")
            assert wait_until(lambda: b.status()["num_running"] == 0)
            stream.close()
            assert len(b.generate("hi", max_tokens=4, ignore_eos=True).token_ids) == 4
    finally:
        channel.close()
        scheduler.stop()
        worker.stop()
