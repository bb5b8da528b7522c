"""`fastserve bench parallel`: decode throughput of worker-group layouts, side by side.

For each layout T x P it starts a worker group on this machine (T tensor-parallel ranks; the
threads given divided among them), a scheduler in front of it, keeps B requests decoding and
reads the scheduler's own iteration histograms over a window of steady decode iterations
(``bench overhead``'s measurement). Printed per layout: the iteration time, the part of it
outside the group's compute, and decode tokens/s, with the ratio to the first layout. What
separates a layout of T ranks from one process is the communication (two all-reduces per
layer and the Step's hand-off to the followers) and how well T smaller matmuls use the cores.
Pipeline stages (P > 1) are not built yet; such a layout is refused by name.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from fastserve.bench.engine import _int_list
from fastserve.bench.overhead import _free_port, measure


def _layouts(text: str) -> list[tuple[int, int]]:
    out = []
    for part in text.split(","):
        t, _, p = part.strip().partition("x")
        if not t.isdigit() or not (p or "1").isdigit() or int(t) < 1 or int(p or "1") < 1:
            raise argparse.ArgumentTypeError(f"a layout is TxP with T, P >= 1, got {part!r}")
        out.append((int(t), int(p or "1")))
    return out


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("parallel", help="decode tokens/s of worker-group layouts (T x P)")
    p.add_argument("--model", default=None, help="model (default: the default model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--layouts", default="1x1,3x1", type=_layouts,
                   help="comma-separated TxP layouts, the first the baseline (default 1x1,3x1)")
    p.add_argument("--batch-sizes", default="1,8", type=_int_list)
    p.add_argument("--iterations", type=int, default=60, help="measured iterations per size")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 1,
                   help="PyTorch threads of a whole group, divided among its ranks (at least "
                   "one each; default: the cores)")
    p.add_argument("--kv-blocks", type=int, default=1024)
    p.add_argument("--json", default=None, metavar="OUT")
    p.set_defaults(func=run)


def group_commands(model: str, device: str, size: int, threads: int,
                   kv_blocks: int) -> list[list[str]]:
    """Rank 0's command line first, then its followers'."""
    base = [sys.executable, "-m", "worker_svc", "--model", model, "--device", device,
            "--num-blocks", str(kv_blocks), "--log-level", "WARNING",
            "--threads", str(max(1, threads // size))]
    if size == 1:
        return [[*base, "--listen", "127.0.0.1:0"]]
    group = ["--tensor-parallel-size", str(size), "--group-address",
             f"127.0.0.1:{_free_port()}"]
    return [base + group + ["--listen", "127.0.0.1:0"],
            *(base + group + ["--tensor-parallel-rank", str(r)] for r in range(1, size))]


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

    for t, p in args.layouts:
        if p > 1:
            print(f"error: layout {t}x{p}: pipeline parallelism (P > 1) is not built yet",
                  file=sys.stderr)
            return 2
    model = str(resolve_model(args.model or DEFAULT_MODEL))
    rows = []
    for t, p in tqdm(args.layouts, desc="layouts", file=sys.stderr):
        cmds = group_commands(model, args.device, t, args.threads, args.kv_blocks)
        specs = [(f"rank{r}", c, WORKER_READY if r == 0 else FOLLOWER_READY)
                 for r, c in enumerate(cmds)]
        started = start_children(specs, 900)
        procs = [proc for proc, _ in started]
        scheduler = None
        try:
            metrics_port = _free_port()
            scheduler, saddr = start_child(
                [sys.executable, "-m", "scheduler_svc", "--model", model, "--workers",
                 started[0][1], "--listen", "127.0.0.1:0", "--metrics-port", str(metrics_port),
                 "--max-batch-size", str(max(args.batch_sizes)), "--log-level", "WARNING"],
                "scheduler listening on ", 600, name="scheduler")
            stub = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(saddr))
            for b in args.batch_sizes:
                r = measure(stub, metrics_port, b, args.iterations)
                rows.append({"tensor_parallel": t, "pipeline_parallel": p,
                             "threads_per_rank": max(1, args.threads // t),
                             "tokens_per_s": r["mean_batch_size"] / r["iteration_s"], **r})
        finally:
            if scheduler is not None:
                stop_child(scheduler)
            for proc in procs:  # rank 0 first: it stops its followers
                stop_child(proc)
    base = {r["batch_size"]: r["tokens_per_s"] for r in rows
            if (r["tensor_parallel"], r["pipeline_parallel"]) == args.layouts[0]}
    print(f"model {args.model or DEFAULT_MODEL}  device {args.device}  threads {args.threads}")
    print(f"{'layout':>7} {'threads/rank':>12} {'batch':>5} {'iteration ms':>13} "
          f"{'outside ms':>11} {'decode tok/s':>13} {'vs first':>9}")
    for r in rows:
        print(f"{r['tensor_parallel']}x{r['pipeline_parallel']:<5} {r['threads_per_rank']:>12} "
              f"{r['batch_size']:>5} {r['iteration_s'] * 1e3:>13.2f} "
              f"{r['outside_s'] * 1e3:>11.2f} {r['tokens_per_s']:>13.1f} "
              f"{r['tokens_per_s'] / base[r['batch_size']]:>8.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model or DEFAULT_MODEL, "device": args.device,
                       "threads": args.threads, "rows": rows}, f, indent=2)
    return 0
