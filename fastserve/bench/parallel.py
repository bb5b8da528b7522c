"""`fastserve bench parallel`: decode throughput of worker-group layouts, side by side.

For each layout T x P it starts a worker group on this machine (T tensor-parallel ranks in
each of P pipeline stages; the threads given divided among all T x P), a scheduler in front of
it, keeps ``batch`` requests decoding in each of the Steps in flight (P of them, or what the
layout's ``:K`` says: ``1x2:1`` is two stages with one batch at a time) and reads the
scheduler's own iteration histograms and the tokens made over a window of steady decode
iterations (``bench overhead``'s measurement). Printed per layout: the time of a Step through
the group, the part of it outside the group's compute, and decode tokens/s over wall time,
with the ratio to the first layout at the same batch per Step. What separates a layout of T
ranks from one process is the communication (two all-reduces per layer and the Step's hand-off
to the followers) and how well T smaller matmuls use the cores; what separates P stages is the
activations' hand-off between stages and whether every stage has a batch to work on.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from fastserve.bench.engine import _int_list
from fastserve.bench.overhead import measure
from fastserve.ports import free_port


def _layouts(text: str) -> list[tuple[int, int, int]]:
    """``TxP`` or ``TxP:K`` (K Steps in flight, default P), comma-separated."""
    out = []
    for part in text.split(","):
        shape, _, k = part.strip().partition(":")
        t, _, p = shape.partition("x")
        p = p or "1"
        if (not t.isdigit() or not p.isdigit() or not (k or "1").isdigit() or int(t) < 1
                or int(p) < 1 or int(k or "1") < 1):
            raise argparse.ArgumentTypeError(
                f"a layout is TxP or TxP:K with T, P, K >= 1, got {part!r}")
        out.append((int(t), int(p), int(k) if k else int(p)))
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("parallel", help="decode tokens/s of worker-group layouts (T x P)")
    p.add_argument("--model", default=None, help="model (default: the default model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--layouts", default="1x1,1x2,1x2:1,3x1", type=_layouts,
                   help="comma-separated TxP layouts (TxP:K: K Steps in flight instead of P), "
                   "the first the baseline (default 1x1,1x2,1x2:1,3x1)")
    p.add_argument("--batch-sizes", default="1,8", type=_int_list,
                   help="requests per Step; a layout with K Steps in flight keeps K times as "
                   "many decoding")
    p.add_argument("--iterations", type=int, default=60, help="measured iterations per size")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="PyTorch threads of a whole group, divided among its ranks (at least "
                   "one each; default: the cores)")
    p.add_argument("--kv-blocks", type=int, default=1024)
    p.add_argument("--json", default=None, metavar="OUT")
    p.set_defaults(func=run)


def group_commands(model: str, device: str, size: int, stages: int, threads: int,
                   kv_blocks: int) -> list[list[str]]:
    """Rank 0's command line first, then its followers' (``cli_serve.group_flags``)."""
    from fastserve.cli_serve import group_flags

    world = size * stages
    base = [sys.executable, "-m", "worker_svc", "--model", model, "--device", device,
            "--num-blocks", str(kv_blocks), "--log-level", "WARNING"]
    if world == 1:
        return [[*base, "--threads", str(threads), "--listen", "127.0.0.1:0"]]
    group, places = group_flags(size, stages, f"127.0.0.1:{free_port()}",
                                max(1, threads // world))
    return [base + group + ["--listen", "127.0.0.1:0"],
            *(base + group + place for place in places[1:])]


def run(args: argparse.Namespace) -> int:
    import grpc
    from tqdm.auto import tqdm

    from fastserve.cli_serve import (
        FOLLOWER_READY,
        WORKER_READY,
        start_child,
        start_children,
        stop_child,
    )
    from fastserve.models import DEFAULT_MODEL, resolve_model
    from fastserve.proto import scheduler_pb2_grpc

    model = str(resolve_model(args.model or DEFAULT_MODEL))
    rows = []
    for t, p, k in tqdm(args.layouts, desc="layouts", file=sys.stderr):
        cmds = group_commands(model, args.device, t, p, args.threads, args.kv_blocks)
        specs = [(f"rank{r}", c, WORKER_READY if r == 0 else FOLLOWER_READY)
                 for r, c in enumerate(cmds)]
        started = start_children(specs, 900)
        procs = [proc for proc, _ in started]
        scheduler = None
        try:
            metrics_port = free_port()
            scheduler, saddr = start_child(
                [sys.executable, "-m", "scheduler_svc", "--model", model, "--workers",
                 started[0][1], "--listen", "127.0.0.1:0", "--metrics-port", str(metrics_port),
                 "--max-batch-size", str(max(args.batch_sizes)), "--steps-in-flight", str(k),
                 "--log-level", "WARNING"],
                "scheduler listening on ", 600, name="scheduler")
            stub = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(saddr))
            for b in args.batch_sizes:
                r = measure(stub, metrics_port, b * k, args.iterations)
                rows.append({"tensor_parallel": t, "pipeline_parallel": p, "in_flight": k,
                             "threads_per_rank": max(1, args.threads // (t * p)),
                             "batch_per_step": b, "tokens_per_s": r["wall_tokens_per_s"],
                             **r})
        finally:
            if scheduler is not None:
                stop_child(scheduler)
            for proc in procs:  # rank 0 first: it stops its followers
                stop_child(proc)
    first = args.layouts[0]
    base = {r["batch_per_step"]: r["tokens_per_s"] for r in rows
            if (r["tensor_parallel"], r["pipeline_parallel"], r["in_flight"]) == first}
    print(f"model {args.model or DEFAULT_MODEL}  device {args.device}  threads {args.threads}")
    print(f"{'layout':>8} {'threads/rank':>12} {'batch/step':>10} {'requests':>8} "
          f"{'step ms':>8} {'outside ms':>10} {'decode tok/s':>13} {'vs first':>9}")
    for r in rows:
        name = f"{r['tensor_parallel']}x{r['pipeline_parallel']}:{r['in_flight']}"
        print(f"{name:>8} {r['threads_per_rank']:>12} {r['batch_per_step']:>10} "
              f"{r['batch_size']:>8} {r['iteration_s'] * 1e3:>8.2f} "
              f"{r['outside_s'] * 1e3:>10.2f} {r['tokens_per_s']:>13.1f} "
              f"{r['tokens_per_s'] / base[r['batch_per_step']]:>8.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model or DEFAULT_MODEL, "device": args.device,
                       "threads": args.threads, "rows": rows}, f, indent=2)
    return 0
