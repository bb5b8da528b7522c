"""`fastserve bench serve`: replay a request trace against a running scheduler.

Each request of the trace (``fastserve.traces``) is sent at its arrival time, on its own
asyncio task and Generate stream, as a synthesized prompt of exactly ``input_tokens`` token ids
(drawn from [1000, 30000) by an RNG seeded by the seed and the request's index, so every run
of the same trace sends the same prompts) with ``ignore_eos``, ``max_tokens = output_tokens``
and temperature 0. Times are taken on this side (``time.perf_counter``, seconds from the start
of the replay): the scheduled arrival, when the request was sent, its first token and its
final message. The job completion time (JCT) is finish - arrival, so time a request spent
waiting to be sent counts against the server, as it would for a real client.

With ``--prompts FILE.jsonl`` the requests are real instructions instead, sent as chat
messages with natural lengths (``fastserve.bench.prompts``); the prompt's token count is the
server's (its usage), and the summary counts the answers that hit the cap.

Requests that fail (refused, error, deadline, no final message) are counted in the summary
(``num_failed``, ``failures``) and listed in the JSON with their error; the latency figures
are over the completed requests.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastserve.bench.capacity import MIN_WAIT_S, saturated_throughput
from fastserve.bench.prompts import ChatPrompt, Prompt, prompt_workload
from fastserve.bench.replay import (
    PROMPT_TOKEN_RANGE,
    STATUS_TIMEOUT_S,
    WARMUP_MAX_TOKENS,
    drive,
    warmup_prompts,
)
from fastserve.bench.replay import warn as _warn
from fastserve.traces import ARRIVALS, TraceRequest, describe, load_trace

# The keys every summary has, in the order tables print them.
SUMMARY_KEYS = (
    "policy", "rate", "num_requests", "num_completed", "num_failed",
    "mean_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s",
    "mean_ttft_s", "p50_ttft_s", "p95_ttft_s", "p99_ttft_s",
    "mean_latency_per_token_s", "p50_latency_per_token_s", "p95_latency_per_token_s",
    "p99_latency_per_token_s", "throughput_tokens_s", "throughput_requests_s", "makespan_s",
)


# ---- command line --------------------------------------------------------------------------
def add_trace_args(p: argparse.ArgumentParser, *, rate_help: str | None = None) -> None:
    """The trace options shared by `bench serve` and `bench compare`."""
    p.add_argument("--trace", default=None, metavar="FILE",
                   help="trace file: Azure CSV, ShareGPT lengths CSV or JSONL (exact lengths, "
                   "synthesized token ids, ignore_eos, greedy)")
    p.add_argument("--prompts", default=None, metavar="FILE",
                   help="instead of --trace: real instructions, one JSON object with an "
                   "'instruction' field per line, each sent once as a user chat message with "
                   "natural output lengths (no ignore_eos; needs --rate)")
    p.add_argument("--repeat", action="store_true",
                   help="with --prompts: send the prompts again when --num-requests needs more")
    p.add_argument("--max-tokens", type=int, default=512,
                   help="with --prompts: the cap on each answer (default 512)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="with --prompts: sampling temperature (default 0, greedy)")
    p.add_argument("--top-p", type=float, default=1.0,
                   help="with --prompts: nucleus sampling (default 1); each request has its "
                   "own fixed seed")
    p.add_argument("--format", dest="trace_format", default=None,
                   choices=["azure", "sharegpt", "jsonl"], help="default: from the file")
    p.add_argument("--rate", type=float, default=None,
                   help=rate_help or "mean arrival rate, requests/s (default: the trace's own "
                   "timestamps; required for traces without them)")
    p.add_argument("--num-requests", type=int, default=None,
                   help="first N requests (a shorter trace is repeated)")
    p.add_argument("--length-scale", type=float, default=1.0,
                   help="divide input and output lengths by this")
    p.add_argument("--max-input", type=int, default=None, help="cap on prompt tokens")
    p.add_argument("--max-output", type=int, default=None, help="cap on output tokens")
    p.add_argument("--arrivals", default=None, choices=list(ARRIVALS),
                   help="synthesized arrivals (default: the trace's timestamps, or poisson "
                   "for a trace without them and for --prompts); given, they replace a "
                   "trace's timestamps")
    p.add_argument("--cv", type=float, default=1.0,
                   help="coefficient of variation of Gamma inter-arrival gaps")
    p.add_argument("--seed", type=int, default=0, help="seed of arrivals and prompts")
    p.add_argument("--timeout-s", type=float, default=None,
                   help="deadline of each request, from its send (default: none)")
    p.add_argument("--warmup", type=int, default=1,
                   help="short untimed requests sent before the replay")


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="replay a request trace against a running scheduler")
    p.add_argument("--address", default=None,
                   help="scheduler HOST:PORT (default $FASTSERVE_ADDRESS or 127.0.0.1:50051); "
                   "nothing is started: the cluster must be running")
    p.add_argument("--openai-url", default=None, metavar="URL",
                   help="replay against this OpenAI-compatible server instead (vLLM, SGLang, "
                   "llama.cpp, FastServe's HTTP API), e.g. http://127.0.0.1:8000")
    p.add_argument("--openai-model", default=None, metavar="NAME",
                   help="model name sent to the OpenAI server (default: the first it lists)")
    p.add_argument("--name", default=None,
                   help="the row's label (default: the scheduler's policy, or 'openai')")
    add_trace_args(p)
    p.add_argument("--json", default=None, metavar="OUT",
                   help="write the summary, every request, the trace and the config as JSON")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=run)


def trace_config(args: argparse.Namespace, rate: float | None) -> dict[str, Any]:
    if args.prompts:
        return {"prompts": str(args.prompts), "rate": rate, "num_requests": args.num_requests,
                "repeat": args.repeat, "max_tokens": args.max_tokens,
                "temperature": args.temperature, "top_p": args.top_p,
                "arrivals": args.arrivals, "cv": args.cv, "seed": args.seed,
                "timeout_s": args.timeout_s, "warmup": args.warmup}
    return {"trace": str(args.trace), "format": args.trace_format, "rate": rate,
            "num_requests": args.num_requests, "length_scale": args.length_scale,
            "max_input": args.max_input, "max_output": args.max_output,
            "arrivals": args.arrivals, "cv": args.cv, "seed": args.seed,
            "timeout_s": args.timeout_s, "warmup": args.warmup}


def workload_from_args(args: argparse.Namespace,
                       rate: float | None) -> tuple[list[TraceRequest], list[Prompt]]:
    """The requests and their prompts: a trace's (token ids) or a prompt file's (chat)."""
    if bool(args.trace) == bool(args.prompts):
        raise ValueError("give exactly one of --trace FILE and --prompts FILE")
    if args.prompts:
        trace, chats = prompt_workload(
            args.prompts, rate=rate, num_requests=args.num_requests, repeat=args.repeat,
            arrivals=args.arrivals or "poisson", cv=args.cv, seed=args.seed,
            max_tokens=args.max_tokens,
            temperature=args.temperature, top_p=args.top_p)
        return trace, list(chats)
    trace = trace_from_args(args, rate)
    return trace, list(make_prompts(trace, args.seed))


def trace_from_args(args: argparse.Namespace, rate: float | None) -> list[TraceRequest]:
    return load_trace(args.trace, fmt=args.trace_format, rate=rate, arrivals=args.arrivals,
                      cv=args.cv, length_scale=args.length_scale, max_input=args.max_input,
                      max_output=args.max_output, num_requests=args.num_requests,
                      seed=args.seed)


def run(args: argparse.Namespace) -> int:
    from fastserve.client import default_address

    try:
        trace, prompts = workload_from_args(args, args.rate)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    address = args.openai_url or args.address or default_address()
    try:
        if args.openai_url:
            from fastserve.bench.openai_backend import replay_openai_async

            result = asyncio.run(replay_openai_async(
                args.openai_url, trace, prompts, model=args.openai_model,
                name=args.name or "openai", timeout_s=args.timeout_s, warmup=args.warmup,
                progress=not args.no_progress))
        else:
            result = replay(address, trace, prompts, timeout_s=args.timeout_s,
                            warmup=args.warmup, progress=not args.no_progress)
            if args.name:
                result["policy"] = args.name
    except ConnectionError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    info = describe(trace)
    rate = args.rate if args.rate is not None else info.get("mean_rate")
    summary = bench_summary(result, rate)
    print_trace_line(info, args)
    print(format_table([summary], baseline=None))
    if args.prompts:
        print(f"{summary['num_length_capped']} of {summary['num_requests']} answers hit the "
              f"{args.max_tokens}-token cap")
    print_predictions(summary)
    print_failures(summary)
    if args.json:
        write_json(args.json, {
            "summary": summary, "requests": result["requests"], "trace": info,
            "config": {**trace_config(args, args.rate), "address": address,
                       "server": result["status"]},
        })
    return 0 if summary["num_failed"] == 0 else 1


# ---- prompts and the replay ----------------------------------------------------------------
def make_prompts(trace: Sequence[TraceRequest], seed: int = 0,
                 token_range: tuple[int, int] = PROMPT_TOKEN_RANGE) -> list[list[int]]:
    """One prompt of exactly ``input_tokens`` ids per request; the same for the same seed."""
    lo, hi = token_range
    if seed < 0:
        raise ValueError(f"the prompt seed must be >= 0, got {seed}")
    return [np.random.default_rng([seed, i]).integers(lo, hi, size=r.input_tokens).tolist()
            for i, r in enumerate(trace)]


def replay(address: str, trace: Sequence[TraceRequest], prompts: Sequence[Prompt], *,
           timeout_s: float | None = None, warmup: int = 1, progress: bool = True,
           desc: str | None = None) -> dict[str, Any]:
    """Replay ``trace`` against the scheduler at ``address``; see ``replay_async``."""
    return asyncio.run(replay_async(address, trace, prompts, timeout_s=timeout_s,
                                    warmup=warmup, progress=progress, desc=desc))


async def replay_async(address: str, trace: Sequence[TraceRequest],
                       prompts: Sequence[Prompt], *, timeout_s: float | None = None,
                       warmup: int = 1, progress: bool = True,
                       desc: str | None = None) -> dict[str, Any]:
    """Send each request at its arrival time; returns ``{"policy", "status", "requests"}``.

    Each request record (``replay.new_record``): index, request_id, arrival, sent, first_token,
    finish (s from the start; None when it never happened), input_tokens, max_tokens,
    output_tokens (received), finish_reason, error (None when it completed), and the server's
    own usage timings. Raises ``ConnectionError`` when the scheduler cannot be reached at the
    start.
    """
    import grpc

    from fastserve.client import _CHANNEL_OPTIONS, _to_dict
    from fastserve.proto import scheduler_pb2 as pb
    from fastserve.proto import scheduler_pb2_grpc

    if len(prompts) != len(trace):
        raise ValueError(f"{len(trace)} requests but {len(prompts)} prompts")
    # Many concurrent streams on one connection: let HTTP/2 run as many as there are requests.
    options = [*_CHANNEL_OPTIONS, ("grpc.max_concurrent_streams", max(100, len(trace) + 10))]
    async with grpc.aio.insecure_channel(address, options=options) as channel:
        stub = scheduler_pb2_grpc.SchedulerStub(channel)
        try:
            status = await stub.Status(pb.StatusRequest(), timeout=STATUS_TIMEOUT_S,
                                       wait_for_ready=True)
        except grpc.aio.AioRpcError as e:
            raise ConnectionError(f"cannot reach the scheduler at {address}: "
                                  f"{e.code().name}: {e.details()}") from None
        for i, ids in enumerate(warmup_prompts(warmup)):
            req = pb.GenerateRequest(
                token_ids=pb.TokenIds(ids=ids), request_id=f"bench-warmup-{i}-{time.time_ns()}",
                sampling=pb.SamplingOptions(max_tokens=WARMUP_MAX_TOKENS, temperature=0.0,
                                            ignore_eos=True))
            try:
                async for _ in stub.Generate(req, timeout=120):
                    pass
            except grpc.aio.AioRpcError as e:
                _warn(f"warm-up request failed: {e.code().name}: {e.details()}")

        async def one(rec: dict[str, Any], prompt: Prompt, t0: float) -> None:
            if isinstance(prompt, ChatPrompt):
                req = pb.GenerateRequest(
                    chat=pb.ChatMessages(messages=[pb.ChatMessage(role="user",
                                                                  content=prompt.text)]),
                    request_id=rec["request_id"],
                    sampling=pb.SamplingOptions(max_tokens=prompt.max_tokens,
                                                temperature=prompt.temperature,
                                                top_p=prompt.top_p, seed=prompt.seed),
                    output_length_hint=prompt.output_length_hint)
            else:
                req = pb.GenerateRequest(
                    token_ids=pb.TokenIds(ids=prompt), request_id=rec["request_id"],
                    sampling=pb.SamplingOptions(max_tokens=rec["max_tokens"], temperature=0.0,
                                                ignore_eos=True))
            final = None
            try:
                async for resp in stub.Generate(req, timeout=timeout_s):
                    now = time.perf_counter() - t0
                    if resp.HasField("chunk") and resp.chunk.token_ids:
                        if rec["first_token"] is None:
                            rec["first_token"] = now
                        rec["output_tokens"] += len(resp.chunk.token_ids)
                    elif resp.HasField("final"):
                        final = resp.final
                        rec["finish"] = now
            except grpc.aio.AioRpcError as e:
                rec["error"] = f"{e.code().name}: {e.details()}"
            except Exception as e:  # noqa: BLE001 - recorded, never dropped
                rec["error"] = f"{type(e).__name__}: {e}"
            if final is not None:
                reason = pb.FinishReason.Name(final.finish_reason)
                rec["finish_reason"] = reason.removeprefix("FINISH_REASON_").lower()
                rec["server_queue_time_s"] = final.usage.queue_time_s
                rec["server_ttft_s"] = final.usage.time_to_first_token_s
                rec["server_total_time_s"] = final.usage.total_time_s
                if isinstance(prompt, ChatPrompt):  # its length is the server's to count
                    rec["input_tokens"] = final.usage.prompt_tokens
                if final.HasField("predicted_output_tokens"):
                    rec["predicted_output_tokens"] = final.predicted_output_tokens
                if rec["error"] is None and rec["finish_reason"] not in ("stop", "length"):
                    rec["error"] = (f"finish reason {rec['finish_reason']}"
                                    + (f": {final.error_message}" if final.error_message else ""))
            elif rec["error"] is None:
                rec["error"] = "the stream ended without a final message"

        records = await drive(trace, prompts, one, label=desc or status.policy,
                              progress=progress)
        try:  # the counters after the run (swaps, preemptions); the start's if unreachable
            status = await stub.Status(pb.StatusRequest(), timeout=STATUS_TIMEOUT_S)
        except grpc.aio.AioRpcError as e:
            _warn(f"Status after the run failed: {e.code().name}: {e.details()}")
    return {"policy": status.policy, "status": _to_dict(status), "requests": records}


# ---- statistics ----------------------------------------------------------------------------
def summarize_requests(records: Sequence[dict[str, Any]], policy: str,
                       rate: float | None) -> dict[str, Any]:
    """The summary of a replay's request records (dicts with arrival, first_token, finish,
    input_tokens, output_tokens and error): ``scheduler_svc.sim.metrics.summarize`` over the
    completed ones, so the simulator and this benchmark compute the same figures, plus the
    request counts (``num_requests`` is all of them, completed or not) and a few more
    percentiles. A record counts as completed when it has a finish time, at least one output
    token and no ``error``. With none completed, the latency figures are None.
    """
    from scheduler_svc.sim.metrics import RequestRecord, percentile, summarize

    done = [r for r in records if r.get("error") is None and r.get("finish") is not None
            and (r.get("output_tokens") or 0) > 0]
    recs = [RequestRecord(r["arrival"], r["finish"] if r.get("first_token") is None
                          else r["first_token"], r["finish"], r["input_tokens"],
                          r["output_tokens"]) for r in done]
    if recs:
        s = summarize(recs, policy, rate)
    else:
        s = dict.fromkeys(SUMMARY_KEYS)
        s.update(policy=policy, rate=rate, throughput_tokens_s=0.0, throughput_requests_s=0.0,
                 makespan_s=0.0)
    s.update(num_requests=len(records), num_completed=len(done),
             num_failed=len(records) - len(done))
    jct = [r.jct_s for r in recs]
    ttft = [r.ttft_s for r in recs]
    per_token = [r.jct_s / r.output_tokens for r in recs]
    for name, values in (("ttft_s", ttft), ("latency_per_token_s", per_token)):
        for q in (50, 99):
            s[f"p{q}_{name}"] = percentile(values, q) if values else None
    s["max_jct_s"] = max(jct) if jct else None
    s["total_input_tokens"] = sum(r.input_tokens for r in recs)
    s["total_output_tokens"] = sum(r.output_tokens for r in recs)
    return {**{k: s[k] for k in SUMMARY_KEYS}, **s}


def bench_summary(result: dict[str, Any], rate: float | None,
                  min_wait_s: float = MIN_WAIT_S) -> dict[str, Any]:
    """``summarize_requests`` plus what only a real replay has: send lag, server timings,
    failures, the capacity while requests waited ``min_wait_s`` or more in the queue."""
    reqs = result["requests"]
    s = summarize_requests(reqs, result["policy"], rate)
    lag = np.array([r["sent"] - r["arrival"] for r in reqs if r.get("sent") is not None])
    s["num_length_capped"] = sum(1 for r in reqs if r.get("finish_reason") == "length")
    s["mean_send_lag_s"] = float(lag.mean()) if len(lag) else None
    s["max_send_lag_s"] = float(lag.max()) if len(lag) else None
    q = np.array([r["server_queue_time_s"] for r in reqs
                  if r.get("error") is None and r.get("server_queue_time_s") is not None])
    s["mean_server_queue_time_s"] = float(q.mean()) if len(q) else None
    s.update(saturated_throughput(reqs, min_wait_s))
    s.update(prediction_error(reqs))
    s["failures"] = dict(collections.Counter(
        _short(r["error"]) for r in reqs if r.get("error") is not None).most_common())
    status = result.get("status") or {}
    workers = status.get("workers", [])
    s["kv_policy"] = status.get("kv_policy", "")
    for key in ("swap_wait_s", "num_swap_outs", "num_swap_ins", "num_kv_lost",
                "num_recomputes", "num_preemptions"):
        s[key] = sum(float(w.get(key, 0)) for w in workers)
    return s


def prediction_error(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """The predictor's first estimates against the lengths the model chose (completed
    requests the server predicted): count, mean absolute error, Spearman rank correlation."""
    from fastserve.predictor.rank import spearman

    pairs = [(r["predicted_output_tokens"], r["output_tokens"]) for r in records
             if r.get("error") is None and r.get("predicted_output_tokens") is not None]
    if not pairs:
        return {"num_predicted": 0}
    pred, true = np.array(pairs, dtype=float).T
    return {"num_predicted": len(pairs),
            "prediction_mae_tokens": float(np.abs(pred - true).mean()),
            "prediction_spearman": spearman(pred, true)}


def jcts(records: Sequence[dict[str, Any]]) -> list[float]:
    """JCTs (s) of the completed requests."""
    return [r["finish"] - r["arrival"] for r in records
            if r.get("error") is None and r.get("finish") is not None]


def _short(error: str, n: int = 120) -> str:
    return error if len(error) <= n else error[: n - 3] + "..."


# ---- output --------------------------------------------------------------------------------
def _fmt(v: float | None, scale: float = 1.0, digits: int = 2) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{v * scale:.{digits}f}"


def format_kv_table(summaries: Sequence[dict[str, Any]]) -> str:
    """KV memory per run: offloads, uploads, recomputes, and the time iterations waited for
    swaps, also as a share of the run's makespan (every job in the batch waited that long)."""
    head = (f"{'policy':<26} {'swap out':>8} {'swap in':>8} {'lost':>5} {'recompute':>9} "
            f"{'swap wait s':>11} {'of run':>7}")
    lines = [head, "-" * len(head)]
    for s in summaries:
        share = s["swap_wait_s"] / s["makespan_s"] if s.get("makespan_s") else None
        lines.append(f"{run_label(s):<26} {s['num_swap_outs']:>8.0f} {s['num_swap_ins']:>8.0f} "
                     f"{s['num_kv_lost']:>5.0f} {s['num_recomputes']:>9.0f} "
                     f"{s['swap_wait_s']:>11.3f} {_fmt(share, 100, 2):>6}%")
    return "\n".join(lines)


def format_table(summaries: Sequence[dict[str, Any]], baseline: str | None = "fcfs") -> str:
    """One row per summary: completed/failed, JCT (s), TTFT (s), latency per output token
    (ms), throughput; with ``baseline`` among the policies of a rate, each row's mean and p95
    JCT as a multiple of the baseline's (lower is better)."""
    base: dict[Any, dict[str, Any]] = {}
    for s in summaries:  # the first run of the baseline at each rate (--rounds makes several)
        if baseline and s["policy"] == baseline:
            base.setdefault(s["rate"], s)
    head = (f"{'policy':<26} {'rate':>6} {'ok':>5} {'fail':>4} | {'JCT mean':>8} {'p50':>7} "
            f"{'p95':>7} {'p99':>7} | {'TTFT mean':>9} {'p95':>7} | {'ms/tok mean':>11} "
            f"{'p95':>7} | {'tok/s':>7} {'req/s':>6} {'sat tok/s':>9}")
    if base:
        head += f" | {'JCT mean/' + str(baseline):>13} {'p95/' + str(baseline):>8}"
    lines = [head, "-" * len(head)]
    for k, s in enumerate(summaries):
        if k and s["rate"] != summaries[k - 1]["rate"]:
            lines.append("")
        row = (f"{run_label(s):<26} {_fmt(s['rate']):>6} {s['num_completed']:>5} "
               f"{s['num_failed']:>4} | {_fmt(s['mean_jct_s'], digits=3):>8} "
               f"{_fmt(s['p50_jct_s'], digits=3):>7} {_fmt(s['p95_jct_s'], digits=3):>7} "
               f"{_fmt(s['p99_jct_s'], digits=3):>7} | "
               f"{_fmt(s['mean_ttft_s'], digits=3):>9} {_fmt(s['p95_ttft_s'], digits=3):>7} | "
               f"{_fmt(s['mean_latency_per_token_s'], 1e3, 1):>11} "
               f"{_fmt(s['p95_latency_per_token_s'], 1e3, 1):>7} | "
               f"{_fmt(s['throughput_tokens_s'], digits=1):>7} "
               f"{_fmt(s['throughput_requests_s']):>6} "
               f"{_fmt(s.get('saturated_tokens_s'), digits=1):>9}")
        if base:
            b = base.get(s["rate"])
            row += (f" | {_ratio(s, b, 'mean_jct_s'):>13} {_ratio(s, b, 'p95_jct_s'):>8}")
        lines.append(row)
    lines.append("JCT and TTFT in s; ms/tok = JCT / output tokens, in ms; sat tok/s = tokens/s "
                 "while requests queued (the capacity: fastserve/bench/capacity.py)")
    return "\n".join(lines)


def run_label(summary: dict[str, Any]) -> str:
    """A run's name in tables: its policy, and its round when `bench compare --rounds` made
    several."""
    rnd = summary.get("round")
    return summary["policy"] + (f" #{rnd}" if rnd else "")


def _ratio(s: dict, b: dict | None, key: str) -> str:
    if b is None or not s.get(key) or not b.get(key):
        return "-"
    return f"{s[key] / b[key]:.2f}x"


def print_trace_line(info: dict[str, Any], args: argparse.Namespace) -> None:
    rate = info.get("mean_rate")
    if args.prompts:
        print(f"prompts {args.prompts}: {info['count']} requests, mean rate {_fmt(rate)} req/s "
              f"over {_fmt(info.get('span_s'), digits=1)} s; natural lengths, at most "
              f"{args.max_tokens} tokens, temperature {args.temperature:g}, top-p "
              f"{args.top_p:g}")
        return
    print(f"trace {args.trace}: {info['count']} requests, mean rate "
          f"{_fmt(rate)} req/s over {_fmt(info.get('span_s'), digits=1)} s; input tokens mean "
          f"{info.get('mean_input_tokens', 0):.0f} p99 {info.get('p99_input_tokens', 0):.0f}, "
          f"output tokens mean {info.get('mean_output_tokens', 0):.0f} p99 "
          f"{info.get('p99_output_tokens', 0):.0f} (length scale {args.length_scale:g}, caps "
          f"{args.max_input}/{args.max_output})")


def print_predictions(summary: dict[str, Any]) -> None:
    """The server's length predictions against the answers (when it predicted any)."""
    if summary.get("num_predicted"):
        print(f"{run_label(summary)}: predicted lengths of {summary['num_predicted']} answers: "
              f"MAE {summary['prediction_mae_tokens']:.1f} tokens, Spearman "
              f"{summary['prediction_spearman']:.3f}")


def print_failures(summary: dict[str, Any]) -> None:
    if summary["num_failed"]:
        print(f"{run_label(summary)}: {summary['num_failed']} of {summary['num_requests']} "
              "requests failed:")
        for error, n in summary["failures"].items():
            print(f"  {n:>5} x {error}")


def write_json(path: str, obj: Any) -> None:
    with open(path, "w") as f:
        json.dump(obj, f, indent=2)
        f.write("\n")
