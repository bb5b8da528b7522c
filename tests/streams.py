"""A long greedy stream over the scheduler's gRPC API, and which worker runs it: for the tests
that take a worker away mid-stream (failover, discovery)."""

from __future__ import annotations

import time

from fastserve.proto import scheduler_pb2 as spb

PROMPT = "Once upon a time, in a quiet harbor town"
TOKENS = 1200


def request(rid: str, tokens: int = TOKENS) -> spb.GenerateRequest:
    return spb.GenerateRequest(text=PROMPT, request_id=rid, sampling=spb.SamplingOptions(
        max_tokens=tokens, temperature=0.0, ignore_eos=True))


def run(stub, rid: str, on_chunk=None, tokens: int = TOKENS):
    """The stream's token ids and its final message; ``on_chunk(n)`` after each chunk."""
    ids, final = [], None
    for msg in stub.Generate(request(rid, tokens), timeout=120):
        if msg.HasField("final"):
            final = msg.final
        else:
            ids += list(msg.chunk.token_ids)
            if on_chunk is not None:
                on_chunk(len(ids))
    return ids, final


def busy_worker(stub) -> str:
    """The address of the worker running a job now."""
    for _ in range(200):
        for w in stub.Status(spb.StatusRequest()).workers:
            if w.num_running and w.num_used_blocks:
                return w.address
        time.sleep(0.01)
    raise AssertionError("no worker runs the job")
