"""The swap engine against a real ``python -m kvstore_svc`` process, on the tiny random Llama.

The engine is driven directly (as the scheduler would through Steps). A stored block of the
tiny model is 2 layers x (k, v) x 16 tokens x 2 kv heads x 16 dims x 4 bytes = 8 KiB.
"""

from __future__ import annotations

import contextlib
import math
import random
import time

import pytest
import torch
from engine_driver import DriverJob, assert_matches, drive, drive_swapping, hf_greedy
from procs import free_port, start_kvstore

from worker_svc.engine import ErrorCode, JobCommand, NewJob, StepCommand, SwapIn
from worker_svc.loader import EngineConfig, load_engine
from worker_svc.swap import SwapEngine
from worker_svc.swap_copy import StreamCopier

BLOCK_SIZE = 16
BLOCK_BYTES = 2 * 2 * BLOCK_SIZE * 2 * 16 * 4
LENGTHS = [3, 17, 40, 70, 100]
MAX_TOKENS = 20


@pytest.fixture(scope="module")
def prompts() -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(256) for _ in range(n)] for n in LENGTHS]


@pytest.fixture(scope="module")
def refs(tiny_llama_dir, prompts):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
    return [hf_greedy(hf, p, MAX_TOKENS) for p in prompts]


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("swap-logs")


@pytest.fixture(scope="module")
def store(logs):
    s = start_kvstore(logs, 4096 * BLOCK_BYTES)
    yield s
    assert s.stop() == 0, s.log()


class FakeStreams:
    """Streams and events that do nothing, so the CUDA data path (gather into staging on a
    copy stream, scatter back) runs on the CPU; it checks that path's block layout, not its
    concurrency."""

    class Stream:
        def __init__(self, device=None):
            pass

        def wait_stream(self, other):
            pass

        def wait_event(self, event):
            pass

    class Event:
        def record(self, stream=None):
            pass

        def synchronize(self):
            pass

    def current_stream(self, device=None):
        return self.Stream()

    def stream(self, s):
        return contextlib.nullcontext()


@pytest.fixture
def make_engine(tiny_llama_dir):
    engines = []

    def make(address: str | None, num_blocks: int = 64, path: str = "shm"):
        cfg = EngineConfig(model=str(tiny_llama_dir), num_blocks=num_blocks,
                           block_size=BLOCK_SIZE, kvstore=address if path == "shm" else None,
                           kvstore_client_id=f"test-{len(engines)}")
        engine = load_engine(cfg).engine
        if path == "grpc":  # the cross-node data path: gRPC streams instead of shared memory
            engine.swap = SwapEngine(engine.pool, address, client_id=cfg.kvstore_client_id,
                                     prefer_shm=False)
        elif path == "streams":
            engine.swap = SwapEngine(engine.pool, address, client_id=cfg.kvstore_client_id,
                                     copier=StreamCopier(engine.pool, FakeStreams()))
        engines.append(engine)
        if address is not None:
            assert engine.swap.store.wait_connected(10)
            assert engine.swap.store.client.same_node == (path != "grpc")
        return engine

    yield make
    for e in engines:
        e.swap.close()


def store_used(engine) -> int:
    assert engine.swap.wait_idle()  # swap-ins free their store blocks right after the copy
    return engine.swap.store.client.stats()["used_blocks"]


def blocks(n_tokens: int) -> int:
    return math.ceil(n_tokens / BLOCK_SIZE)


class Jobs:
    """Jobs driven by hand: each command computes all pending tokens; blocks come from a
    counter, so a test can say exactly which blocks a job gets."""

    def __init__(self, engine, prompts):
        self.engine = engine
        self.prompts = dict(enumerate(prompts))
        self.out: dict[int, list[int]] = {i: [] for i in self.prompts}
        self.computed = dict.fromkeys(self.prompts, 0)
        self.free = list(range(engine.pool.num_blocks - 1, -1, -1))

    def take(self, n: int) -> list[int]:
        return [self.free.pop() for _ in range(n)]

    def command(self, i: int) -> JobCommand:
        known = len(self.prompts[i]) + len(self.out[i])
        return JobCommand(i, known - self.computed[i])

    def step(self, **parts):
        out = self.engine.step(StepCommand(**parts))
        for r in out.results:
            self.computed[r.job_id] = r.num_computed_tokens
            if r.token_id is not None:
                self.out[r.job_id].append(r.token_id)
        return out

    def admit(self, ids: list[int], extra_tokens: int = MAX_TOKENS) -> None:
        """Register and prefill ``ids``, each with blocks for prompt + ``extra_tokens``."""
        new = [NewJob(i, self.prompts[i], block_ids=self.take(
            blocks(len(self.prompts[i]) + extra_tokens))) for i in ids]
        out = self.step(new_jobs=new, commands=[self.command(i) for i in ids])
        assert not out.errors, out.errors

    def swap_in(self, i: int) -> SwapIn:
        return SwapIn(i, self.take(blocks(self.computed[i])))


def errors_by_job(out) -> dict[int, ErrorCode]:
    return {e.job_id: e.code for e in out.errors}


@pytest.mark.parametrize("path", ["shm", "grpc", "streams"])
def test_swapping_every_step_matches_no_swapping_and_transformers(
        make_engine, store, prompts, refs, path):
    # Two jobs run at a time; only they and the next two fit on the device.
    num_blocks = 4 * blocks(max(LENGTHS) + MAX_TOKENS)
    engine = make_engine(store.address, num_blocks, path)
    jobs = [DriverJob(i, p, MAX_TOKENS, arrival=i) for i, p in enumerate(prompts)]
    got, tally = drive_swapping(engine, jobs, max_batch=2, chunk=32, reactive_every=3)

    plain = make_engine(None, 256)
    expected = drive(plain, [DriverJob(i, p, MAX_TOKENS) for i, p in enumerate(prompts)])
    assert got == expected
    for i, ref in enumerate(refs):
        assert_matches(got[i], ref, f"prompt {i} with swapping")

    assert all(tally.swap_outs.get(i, 0) >= 3 for i in range(len(prompts))), tally
    assert tally.swap_ins == tally.swap_outs  # every offloaded job came back
    assert tally.proactive > 0 and tally.reactive > 0
    assert tally.blocks_out == tally.blocks_in > 0
    assert tally.hidden + tally.waited > 0
    assert store_used(engine) == 0


def test_corrupted_block_fails_only_its_job(make_engine, store, prompts):
    engine = make_engine(store.address)
    jobs = Jobs(engine, prompts[:3])
    jobs.admit([0, 1, 2])
    out = jobs.step(swap_out=[0, 1])
    assert not out.errors
    assert engine.swap.wait_idle()
    # Flip one byte of job 1's first stored block, straight in the store's shm segment (a
    # view of the slot is a window on it).
    client = engine.swap.store.client
    assert client.same_node
    (slot,) = client.views(engine.swap.store_handles(1)[:1])
    slot[100] ^= 0xFF

    ins = [jobs.swap_in(0), jobs.swap_in(1)]
    out = jobs.step(swap_in=ins, commands=[jobs.command(i) for i in range(3)])
    assert errors_by_job(out) == {1: ErrorCode.DATA_LOSS}, out.errors
    assert "checksum" in out.errors[0].message.lower()
    assert sorted(r.job_id for r in out.results) == [0, 2]
    assert out.swap.failures == {"in:checksum_mismatch": 1}
    assert 1 not in engine.jobs  # dropped: its blocks and store space are free
    assert engine.pool.num_used_blocks == len(engine.jobs[0].block_ids) + len(
        engine.jobs[2].block_ids)

    # The scheduler re-creates the lost job with its output so far; it carries on correctly.
    ref = Jobs(make_engine(None), prompts[:3])
    ref.admit([0, 1, 2])
    ref.step(commands=[ref.command(i) for i in range(3)])
    assert jobs.out[0] == ref.out[0] and jobs.out[2] == ref.out[2]
    out = jobs.step(new_jobs=[NewJob(1, prompts[1], block_ids=jobs.take(4),
                                     output_token_ids=jobs.out[1])],
                    commands=[JobCommand(1, len(prompts[1]) + 1)])
    assert not out.errors
    assert jobs.out[1] == ref.out[1]
    jobs.step(free_job_ids=[0, 2])
    jobs.step(free_job_ids=[1])
    assert engine.pool.num_used_blocks == 0 and store_used(engine) == 0


def test_freed_jobs_leave_nothing_behind(make_engine, store, prompts):
    engine = make_engine(store.address)
    jobs = Jobs(engine, prompts)
    jobs.admit([0, 1, 2, 3, 4])
    assert not jobs.step(swap_out=[0, 1, 2, 3]).errors
    # Freed while (probably) still being offloaded; freed while uploading; uploading and
    # offloaded again in one Step.
    out = jobs.step(free_job_ids=[0], swap_in=[jobs.swap_in(1), jobs.swap_in(2)])
    assert not out.errors
    out = jobs.step(free_job_ids=[1], swap_out=[2])
    assert not out.errors
    assert store_used(engine) == blocks(jobs.computed[2]) + blocks(jobs.computed[3])
    out = jobs.step(free_job_ids=[2, 3, 4])
    assert not out.errors and not engine.jobs
    assert engine.pool.num_used_blocks == 0
    assert engine.swap.num_offloaded_jobs == 0
    assert store_used(engine) == 0


def test_store_full_refuses_and_keeps_the_job(make_engine, logs, prompts):
    small = start_kvstore(logs, 5 * BLOCK_BYTES, name="kvstore-small")
    try:
        engine = make_engine(small.address)
        jobs = Jobs(engine, prompts[3:5])  # 70 and 100 tokens: 5 and 7 blocks
        jobs.admit([0, 1])
        before = list(engine.jobs[1].block_ids)
        out = jobs.step(swap_out=[1, 0])
        assert errors_by_job(out) == {1: ErrorCode.RESOURCE_EXHAUSTED}, out.errors
        assert out.swap.failures == {"out:store_full": 1}
        assert engine.jobs[1].block_ids == before
        # The refused job runs on, with the right tokens; the other one comes back.
        out = jobs.step(swap_in=[jobs.swap_in(0)], commands=[jobs.command(0), jobs.command(1)])
        assert not out.errors
        ref = Jobs(make_engine(None), prompts[3:5])
        ref.admit([0, 1])
        ref.step(commands=[ref.command(0), ref.command(1)])
        assert jobs.out == ref.out
    finally:
        small.stop()


def test_store_killed_and_restarted(make_engine, logs, prompts):
    address = f"127.0.0.1:{free_port()}"
    kv = start_kvstore(logs, 256 * BLOCK_BYTES, "--listen", address, name="kvstore-killed")
    try:
        engine = make_engine(address)
        jobs = Jobs(engine, prompts[:4])
        jobs.admit([0, 1, 2, 3])
        assert not jobs.step(swap_out=[0, 3]).errors
        assert engine.swap.wait_idle()
        kv.kill()

        # Store down: the swap-in fails DATA_LOSS where its job runs, the swap-out UNAVAILABLE.
        out = jobs.step(swap_in=[jobs.swap_in(0)], swap_out=[1],
                        commands=[jobs.command(0), jobs.command(2)])
        assert errors_by_job(out) == {1: ErrorCode.UNAVAILABLE, 0: ErrorCode.DATA_LOSS}
        assert [r.job_id for r in out.results] == [2]  # the worker keeps serving
        assert 0 not in engine.jobs and 1 in engine.jobs
        out = jobs.step(commands=[jobs.command(1), jobs.command(2)])  # job 1 was untouched
        assert not out.errors and len(out.results) == 2

        # Store back (empty): swaps work again; job 3's KV died with the old store.
        kv = start_kvstore(logs, 256 * BLOCK_BYTES, "--listen", address, name="kvstore-again")
        deadline = time.monotonic() + 10
        while (out := jobs.step(swap_out=[1])).errors and time.monotonic() < deadline:
            assert errors_by_job(out) == {1: ErrorCode.UNAVAILABLE}
            time.sleep(0.2)
        assert not out.errors, out.errors
        out = jobs.step(swap_in=[jobs.swap_in(1), jobs.swap_in(3)],
                        commands=[jobs.command(1), jobs.command(2), jobs.command(3)])
        assert errors_by_job(out) == {3: ErrorCode.DATA_LOSS}, out.errors
        assert sorted(r.job_id for r in out.results) == [1, 2]

        ref = Jobs(make_engine(None), prompts[:3])
        ref.admit([0, 1, 2])
        for _ in range(3):
            ref.step(commands=[ref.command(1), ref.command(2)])
        assert jobs.out[1] == ref.out[1][:3] and jobs.out[2] == ref.out[2]
        jobs.step(free_job_ids=[1, 2])
        assert engine.pool.num_used_blocks == 0 and store_used(engine) == 0
    finally:
        kv.stop()


def test_proactive_swap_in_is_hidden_reactive_is_waited_for(make_engine, store):
    rng = random.Random(3)
    long_prompts = [[rng.randrange(256) for _ in range(600)] for _ in range(3)]
    engine = make_engine(store.address, 256)
    jobs = Jobs(engine, long_prompts)
    jobs.admit([0, 1, 2], extra_tokens=0)
    assert not jobs.step(swap_out=[0, 1]).errors

    # Proactive: job 0's swap-in rides along with a Step that computes job 2 ...
    out = jobs.step(swap_in=[jobs.swap_in(0)], commands=[jobs.command(2)])
    assert not out.errors
    assert engine.swap.wait_idle()  # (a real forward pass would take this long)
    # ... so the Step that runs job 0 finds it done and waits for nothing.
    out = jobs.step(commands=[jobs.command(0)])
    assert not out.errors
    assert (out.swap.num_swap_ins_hidden, out.swap.num_swap_ins_waited) == (1, 0)
    assert out.swap_wait_s == 0.0
    # Reactive: swapped in by the Step that runs it, so the Step waits for the copy.
    out = jobs.step(swap_in=[jobs.swap_in(1)], commands=[jobs.command(1)])
    assert not out.errors
    assert (out.swap.num_swap_ins_hidden, out.swap.num_swap_ins_waited) == (0, 1)
    assert out.swap_wait_s >= 0.0  # (> 0 in practice; the count above is what is guaranteed)
