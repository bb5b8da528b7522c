"""`fastserve bench breakdown`: where the time of a request goes, end to end.

Starts a local cluster (KV store, worker, scheduler, as `bench compare` does) and sends, for
each concurrency C (default 1 and 8), C requests at once of exactly ``--input-tokens`` prompt
token ids and ``--output-tokens`` outputs (ignore_eos, greedy), after one warm-up. For each it
prints, side by side:
- what the client saw: JCT, TTFT and the time between tokens (ITL), means over the requests;
- the worker's compute by kind of iteration (prefill only, mixed prefill and decodes, decode
  only, other: frees and swaps with no job computed), from the scheduler's per-kind counters;
- the time of each iteration outside the worker's compute (planning, wire, the Step round
  trip), from the scheduler's own histogram;
- the wall time no iteration covered (admission, streaming to the client after the last
  iteration, idle gaps): the replay's span minus the iterations;
- CPU seconds and threads of every process, the client's included, so processes competing for
  the same cores show up (a worker using about all the cores is computing, not waiting).
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
from typing import Any

from fastserve.bench import serve as bench_serve
from fastserve.bench.run_profile import KINDS, RunProfile
from fastserve.traces import TraceRequest


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("breakdown", help="where a request's time goes: compute by iteration "
                       "kind, scheduler, streaming, CPU per process")
    p.add_argument("--policy", default="fcfs")
    p.add_argument("--model", default=None, help="model (default: the default model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--kv-blocks", type=int, default=2048)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--input-tokens", type=int, default=436)
    p.add_argument("--output-tokens", type=int, default=90)
    p.add_argument("--concurrency", default="1,8", help="comma-separated request counts")
    p.add_argument("--scheduler-args", default="", help="extra scheduler arguments")
    p.add_argument("--no-kvstore", action="store_true", help="start no KV store")
    p.add_argument("--kvstore-budget", default="2GiB")
    p.add_argument("--json", default=None, metavar="OUT", help="write the figures as JSON")
    p.set_defaults(func=run, kv_policies=None, fresh_worker=False, max_waiting=None)


def run(args: argparse.Namespace) -> int:
    from fastserve.bench.compare import _Cluster
    from fastserve.models import DEFAULT_MODEL, resolve_model
    from fastserve.ports import free_port

    try:
        levels = [int(x) for x in args.concurrency.split(",") if x.strip()]
        if not levels or min(levels) < 1:
            raise ValueError
    except ValueError:
        print(f"error: --concurrency must list positive integers, got {args.concurrency!r}",
              file=sys.stderr)
        return 2
    model = str(resolve_model(args.model or DEFAULT_MODEL, progress=True))
    metrics_port = free_port()
    cluster = _Cluster(args, model, max(1024, max(levels)), metrics_port=metrics_port)
    rows = []
    try:
        address = cluster.start(args.policy)
        procs = cluster.procs()
        for c in levels:
            rows.append(measure(address, metrics_port, procs, c, args))
    finally:
        cluster.close()
    print(f"model {args.model or DEFAULT_MODEL}, policy {args.policy}, max batch "
          f"{args.max_batch_size}, {args.input_tokens} prompt tokens, {args.output_tokens} "
          f"output tokens, {os.cpu_count()} cores")
    print(format_rows(rows))
    if args.json:
        bench_serve.write_json(args.json, {"rows": rows, "config": {
            k: v for k, v in vars(args).items() if k != "func"}})
    return 0 if all(r["num_failed"] == 0 for r in rows) else 1


def measure(address: str, metrics_port: int, procs: dict[str, Any], concurrency: int,
            args: argparse.Namespace) -> dict[str, Any]:
    trace = [TraceRequest(0.0, args.input_tokens, args.output_tokens)] * concurrency
    prompts = bench_serve.make_prompts(trace, seed=concurrency)
    bench_serve.replay(address, trace[:1], prompts[:1], warmup=0, progress=False)  # warm-up
    profile = RunProfile(metrics_port, procs)
    result = bench_serve.replay(address, trace, prompts, warmup=0, progress=False)
    row: dict[str, Any] = {"concurrency": concurrency, **profile.finish()}
    done = [r for r in result["requests"] if r["error"] is None]
    row["num_failed"] = len(trace) - len(done)
    row["mean_jct_s"] = _mean([r["finish"] - r["arrival"] for r in done])
    row["mean_ttft_s"] = _mean([r["first_token"] - r["arrival"] for r in done])
    row["mean_itl_s"] = _mean([(r["finish"] - r["first_token"]) / (r["output_tokens"] - 1)
                               for r in done if r["output_tokens"] > 1])
    span = row["span_s"]
    row["uncovered_s"] = max(0.0, span - row["compute_s"] - row["outside_compute_s"])
    row["cores_busy"] = sum(row[k] for k in row if k.startswith("cpu_")) / span
    row["threads"] = {name: threads(p.pid) for name, p in procs.items() if p is not None}
    return row


def threads(pid: int) -> int | None:
    try:
        for line in pathlib.Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("Threads:"):
                return int(line.split()[1])
    except OSError:
        pass
    return None


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def format_rows(rows: list[dict[str, Any]]) -> str:
    f = bench_serve._fmt
    lines = []
    for r in rows:
        c = r["concurrency"]
        lines.append(f"-- {c} request{'s' if c > 1 else ''} at once "
                     f"({r['num_failed']} failed), replay span {f(r['span_s'])} s")
        lines.append(f"  client       JCT {f(r['mean_jct_s'], digits=3)} s   TTFT "
                     f"{f(r['mean_ttft_s'], digits=3)} s   between tokens "
                     f"{f(r['mean_itl_s'], 1e3, 1)} ms")
        parts = []
        for kind in KINDS:
            n, t = r[f"{kind}_iterations"], r[f"{kind}_compute_s"]
            parts.append(f"{kind} {n} x {f(t / n if n else None, 1e3, 1)} ms = {f(t)} s")
        lines.append("  worker       " + "   ".join(parts))
        span = r["span_s"] or 1.0
        lines.append(f"  of the span  compute {f(r['compute_s'])} s "
                     f"({f(r['compute_s'] / span, 100, 0)}%)"
                     f"   outside compute {f(r['outside_compute_s'])} s "
                     f"({f(r['outside_compute_s'] / max(r['iterations'], 1), 1e3, 2)} ms per "
                     f"iteration)   not in any iteration {f(r['uncovered_s'])} s")
        cpu = "   ".join(f"{n} {f(r[f'cpu_{n}_s'])}" for n in
                         ("worker", "scheduler", "kvstore", "client") if f"cpu_{n}_s" in r)
        lines.append(f"  CPU s        {cpu}   ({f(r['cores_busy'])} of {r['cores']} cores busy)")
        lines.append("  threads      " + "   ".join(f"{n} {t}" for n, t in r["threads"].items()))
    return "\n".join(lines)
