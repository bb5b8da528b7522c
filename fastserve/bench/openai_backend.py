"""Trace replay against an OpenAI-compatible HTTP server (vLLM, SGLang, llama.cpp, TGI).

The same replay as the gRPC one (``replay.drive``: same arrival times, same synthesized prompts,
same records and summary), sent as ``POST /v1/completions`` with the prompt as a list of token
ids, ``max_tokens`` = the trace's output length, ``ignore_eos``, temperature 0 (a prompt
workload's chat prompts as ``POST /v1/chat/completions`` with their own sampling), streamed
(server-sent events) with ``stream_options.include_usage`` so the server's own token count
closes each request. The first streamed choice marks the first token; the usage chunk gives
the output length (the count of streamed choices when a server sends no usage).
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from typing import Any

from fastserve.bench.prompts import ChatPrompt, Prompt
from fastserve.bench.replay import STATUS_TIMEOUT_S, WARMUP_MAX_TOKENS, drive, warmup_prompts
from fastserve.bench.replay import warn as _warn
from fastserve.traces import TraceRequest


def base_url(url: str) -> str:
    """``http://host:port`` or ``http://host:port/v1`` -> the ``/v1`` root, no trailing slash."""
    url = url.rstrip("/")
    return url if url.endswith("/v1") else url + "/v1"


async def server_model(client: Any, root: str, model: str | None) -> str:
    """The model to ask for: ``model``, or the first the server lists; raises
    ``ConnectionError`` when ``/v1/models`` does not answer."""
    import httpx

    try:
        r = await client.get(f"{root}/models", timeout=STATUS_TIMEOUT_S)
        r.raise_for_status()
        listed = [m["id"] for m in r.json().get("data", [])]
    except (httpx.HTTPError, ValueError, KeyError) as e:
        raise ConnectionError(f"cannot list models at {root}/models: {type(e).__name__}: "
                              f"{e}") from None
    if model is not None:
        return model
    if not listed:
        raise ConnectionError(f"{root}/models lists no model; pass --openai-model")
    return listed[0]


def completion_body(model: str, prompt: Sequence[int], max_tokens: int) -> dict[str, Any]:
    return {"model": model, "prompt": list(prompt), "max_tokens": max_tokens,
            "temperature": 0.0, "ignore_eos": True, "stream": True,
            "stream_options": {"include_usage": True}}


def chat_body(model: str, prompt: ChatPrompt) -> dict[str, Any]:
    return {"model": model, "messages": [{"role": "user", "content": prompt.text}],
            "max_tokens": prompt.max_tokens, "temperature": prompt.temperature,
            "top_p": prompt.top_p, "seed": prompt.seed, "stream": True,
            "stream_options": {"include_usage": True}}


async def stream_completion(client: Any, root: str, body: dict[str, Any], rec: dict[str, Any],
                            t0: float, timeout_s: float | None,
                            endpoint: str = "completions") -> None:
    """POST one streamed completion (or chat completion); fills ``rec`` (times relative to
    ``t0``; for a chat, its ``input_tokens`` from the server's usage)."""
    import httpx

    streamed = 0
    usage_tokens = None
    try:
        async with client.stream("POST", f"{root}/{endpoint}", json=body,
                                 timeout=httpx.Timeout(timeout_s)) as r:
            if r.status_code != 200:
                text = (await r.aread()).decode(errors="replace")
                rec["error"] = f"HTTP {r.status_code}: {text[:300]}"
                return
            async for line in r.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if chunk.get("error"):
                    rec["error"] = f"server error: {chunk['error']}"
                    return
                if chunk.get("choices"):
                    if rec["first_token"] is None:
                        rec["first_token"] = time.perf_counter() - t0
                    streamed += 1
                    reason = chunk["choices"][0].get("finish_reason")
                    if reason:
                        rec["finish_reason"] = reason
                if chunk.get("usage"):
                    usage_tokens = chunk["usage"].get("completion_tokens")
                    if "messages" in body and chunk["usage"].get("prompt_tokens") is not None:
                        rec["input_tokens"] = chunk["usage"]["prompt_tokens"]
        rec["finish"] = time.perf_counter() - t0
    except httpx.HTTPError as e:
        rec["error"] = f"{type(e).__name__}: {e}"
        return
    rec["output_tokens"] = usage_tokens if usage_tokens is not None else streamed
    if rec["finish_reason"] not in ("stop", "length", None):
        rec["error"] = f"finish reason {rec['finish_reason']}"


async def replay_openai_async(url: str, trace: Sequence[TraceRequest],
                              prompts: Sequence[Prompt], *, model: str | None = None,
                              name: str = "openai", timeout_s: float | None = None,
                              warmup: int = 1, progress: bool = True,
                              desc: str | None = None) -> dict[str, Any]:
    """``serve.replay_async`` against an OpenAI-compatible server; same return shape, with
    ``policy`` = ``name`` and ``status`` = the server's address and model."""
    import logging

    import httpx

    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per request
    if len(prompts) != len(trace):
        raise ValueError(f"{len(trace)} requests but {len(prompts)} prompts")
    root = base_url(url)
    limits = httpx.Limits(max_connections=len(trace) + 10,
                          max_keepalive_connections=len(trace) + 10)
    async with httpx.AsyncClient(limits=limits, timeout=httpx.Timeout(timeout_s)) as client:
        model = await server_model(client, root, model)
        for ids in warmup_prompts(warmup):
            rec: dict[str, Any] = {"first_token": None, "finish_reason": None, "error": None}
            await stream_completion(client, root, completion_body(model, ids, WARMUP_MAX_TOKENS),
                                    rec, time.perf_counter(), 120.0)
            if rec["error"]:
                _warn(f"warm-up request failed: {rec['error']}")

        async def one(rec: dict[str, Any], prompt: Prompt, t0: float) -> None:
            if isinstance(prompt, ChatPrompt):
                await stream_completion(client, root, chat_body(model, prompt), rec, t0,
                                        timeout_s, endpoint="chat/completions")
                return
            await stream_completion(client, root, completion_body(model, prompt, rec["max_tokens"]),
                                    rec, t0, timeout_s)

        records = await drive(trace, prompts, one, label=desc or name, progress=progress)
    return {"policy": name, "status": {"server": root, "model": model, "kind": "openai"},
            "requests": records}
