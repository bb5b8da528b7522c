"""No tokenizer work on the scheduler's event loop (issue 13): the text thread's contract, and
the servicer streaming a request with every encode and decode on a thread of its own."""

from __future__ import annotations

import asyncio
import threading

import pytest

from fastserve.proto import scheduler_pb2 as spb
from scheduler_svc.api.servicer import SchedulerServicer
from scheduler_svc.api.text import TextModel
from scheduler_svc.api.text_thread import TextThread
from scheduler_svc.cluster import Limits
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import JobUpdate
from scheduler_svc.core.job import JobStatus


@pytest.fixture(scope="module")
def tm() -> TextModel:
    from fastserve.models import DEFAULT_MODEL, resolve_model

    return TextModel.load(resolve_model(DEFAULT_MODEL))


def test_calls_run_on_the_thread_in_order_one_hop_per_loop_turn(tm):
    tt = TextThread(tm, "test-text")
    assert tt.text is not tm and tt.text.tokenizer is not tm.tokenizer  # a model of its own
    hops = []
    send = tt._pool.submit

    def counting_submit(fn, *args):
        hops.append(len(args[0]))
        return send(fn, *args)

    tt._pool.submit = counting_submit  # type: ignore[method-assign]

    async def main():
        loop_thread = threading.get_ident()
        seen = []

        def work(i):
            seen.append(i)
            return i, threading.get_ident() != loop_thread

        out = await asyncio.gather(*(tt.run(work, i) for i in range(32)))
        assert out == [(i, True) for i in range(32)]
        assert seen == list(range(32))
        assert hops == [32]  # 32 calls queued in one turn went over together

    asyncio.run(main())
    tt.close()


def test_an_exception_reaches_its_own_caller_only_and_a_gone_caller_harms_no_one(tm):
    tt = TextThread(tm, "test-text")

    def boom():
        raise ValueError("bad")

    async def main():
        gone = asyncio.ensure_future(tt.run(lambda: 1))
        results = await asyncio.gather(tt.run(lambda: "a"), tt.run(boom), tt.run(lambda: "c"),
                                       return_exceptions=True)
        gone.cancel()
        assert results[0] == "a" and results[2] == "c"
        assert isinstance(results[1], ValueError)
        assert await tt.run(lambda: "after") == "after"

    asyncio.run(main())
    tt.close()


class _Group:
    pass


class OneWorkerCluster:
    """Answers a request with its prompt's own ids as output, two per iteration."""

    def __init__(self, vocab_size):
        self.vocab_size = vocab_size
        self.live = {}

    def pick(self):
        return _Group()

    def limits(self, group):
        return Limits(self.vocab_size, 512, frozenset())

    def is_live(self, request_id):
        return request_id in self.live

    def can_admit(self, group):
        return True

    def submit(self, job, group, sink):
        self.live[job.request_id] = job
        out = list(job.prompt[:6])

        def iterate(i):
            ids = out[i:i + 2]
            job.output.extend(ids)
            last = i + 2 >= len(out)
            if last:
                job.status = JobStatus.FINISHED_LENGTH
            sink(JobUpdate(job, ids, [0.0] * len(ids), last))
            if not last:
                asyncio.get_running_loop().call_later(0.001, iterate, i + 2)

        asyncio.get_running_loop().call_soon(iterate, 0)

    def end(self, request_id, status):
        return False

    def forget(self, request_id):
        self.live.pop(request_id, None)


class _Context:
    def invocation_metadata(self):
        return ()

    async def abort(self, code, details):
        raise AssertionError(f"aborted: {code} {details}")


def test_the_servicer_tokenizes_and_detokenizes_off_the_event_loop(tm, monkeypatch):
    prompt = "The quick brown fox jumps over the lazy dog"
    expected = tm.decode(tm.encode(prompt)[:6])
    calls: list[tuple[str, str]] = []
    for name in ("encode", "decode", "render_chat"):
        real = getattr(TextModel, name)

        def spy(self, *a, _real=real, _name=name, **k):
            calls.append((_name, threading.current_thread().name))
            return _real(self, *a, **k)

        monkeypatch.setattr(TextModel, name, spy)
    servicer = SchedulerServicer(SchedulerConfig(), tm, OneWorkerCluster(tm.vocab_size), "m")

    async def main():
        loop_thread = threading.current_thread().name
        chunks = [r async for r in servicer.Generate(
            spb.GenerateRequest(text=prompt, request_id="r1"), _Context())]
        return loop_thread, chunks

    loop_thread, chunks = asyncio.run(main())
    text = "".join(c.chunk.text for c in chunks if c.HasField("chunk"))
    assert text == expected  # the stream is still right
    assert chunks[-1].final.usage.completion_tokens == 6
    kinds = {name for name, _ in calls}
    assert {"encode", "decode"} <= kinds
    on_loop = [c for c in calls if c[1] == loop_thread]
    assert on_loop == [], f"tokenizer work on the event loop: {on_loop}"
    assert {t for n, t in calls if n == "encode"} == {"fastserve-text-in_0"}
    assert {t for n, t in calls if n == "decode"} == {"fastserve-text-out_0"}
