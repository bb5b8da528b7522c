"""The replay every trace benchmark shares: each request on its own task at its arrival time.

``drive`` sends the requests of a trace through a backend's ``one(record, prompt, t0)`` (the
scheduler's gRPC API in ``serve.py``, an OpenAI-compatible server in ``openai_backend.py``)
and returns their records; ``warmup_prompts`` are the untimed requests sent before.
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np

from fastserve.bench.prompts import Prompt
from fastserve.traces import TraceRequest

PROMPT_TOKEN_RANGE = (1000, 30000)
WARMUP_PROMPT_TOKENS = 16
WARMUP_MAX_TOKENS = 4
STATUS_TIMEOUT_S = 30.0


def warmup_prompts(n: int) -> list[list[int]]:
    """The untimed warm-up prompts: the same short token ids for every backend."""
    return [np.random.default_rng([0xFFFFFFFF, i]).integers(
        *PROMPT_TOKEN_RANGE, size=WARMUP_PROMPT_TOKENS).tolist() for i in range(n)]


def new_record(i: int, r: TraceRequest, request_id: str, sent: float) -> dict[str, Any]:
    """A request's record before it is sent: what the trace asks, nothing received yet."""
    return {
        "index": i, "request_id": request_id, "arrival": r.arrival_s, "sent": sent,
        "first_token": None, "finish": None, "input_tokens": r.input_tokens,
        "max_tokens": r.output_tokens, "output_tokens": 0, "finish_reason": None,
        "error": None, "server_queue_time_s": None, "server_ttft_s": None,
        "server_total_time_s": None,
    }


SendOne = Callable[[dict[str, Any], Prompt, float], Awaitable[None]]


async def drive(trace: Sequence[TraceRequest], prompts: Sequence[Prompt], one: SendOne,
                *, label: str, progress: bool = True) -> list[dict[str, Any]]:
    """The replay shared by every backend: each request on its own task at its arrival time.

    ``one(record, prompt, t0)`` sends one request and fills its record (``first_token``,
    ``finish``, ``output_tokens``, ``finish_reason``, ``error``; times are
    ``time.perf_counter() - t0``). A record that ends with no error but no output is failed.
    """
    from tqdm.auto import tqdm

    bar = tqdm(total=len(trace), desc=label, unit="req", file=sys.stderr,
               disable=not progress, dynamic_ncols=True)
    records: list[dict[str, Any]] = [{} for _ in trace]
    failed = 0
    run_id = time.time_ns()
    t0 = time.perf_counter()

    async def send(i: int, r: TraceRequest) -> None:
        nonlocal failed
        rec = records[i] = new_record(i, r, f"bench-{run_id}-{i}", time.perf_counter() - t0)
        try:
            await one(rec, prompts[i], t0)
        except Exception as e:  # noqa: BLE001 - recorded, never dropped
            rec["error"] = rec["error"] or f"{type(e).__name__}: {e}"
        if rec["error"] is None and rec["output_tokens"] == 0:
            rec["error"] = "no output tokens"
        if rec["error"] is not None:
            failed += 1
            bar.set_postfix(failed=failed, refresh=False)
        bar.update(1)

    tasks = []
    try:
        for i, r in enumerate(trace):
            delay = t0 + r.arrival_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(send(i, r)))
        await asyncio.gather(*tasks)
    finally:
        for t in tasks:
            t.cancel()
        bar.close()
    return records


def warn(msg: str) -> None:
    from tqdm.auto import tqdm

    tqdm.write(f"warning: {msg}", file=sys.stderr)
