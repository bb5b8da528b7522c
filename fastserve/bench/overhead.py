"""`fastserve bench overhead`: the scheduler's cost per iteration outside the worker's compute.

Starts a local cluster (worker and scheduler processes, real gRPC), keeps exactly B requests
decoding, and reads the scheduler's own Prometheus histograms over a window of steady-state
iterations: per iteration, the worker's compute time and the time outside it (scheduling,
protobuf, the Step round trip, streaming to clients while the worker computes is excluded
because it overlaps).
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
import urllib.request

from fastserve.bench.engine import _int_list
from fastserve.ports import free_port


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("overhead", help="scheduler overhead per iteration, as a fraction")
    p.add_argument("--model", default=None, help="model (default: the default model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--batch-sizes", default="1,32", type=_int_list)
    p.add_argument("--iterations", type=int, default=100, help="measured iterations per size")
    p.add_argument("--kv-blocks", type=int, default=2048)
    p.add_argument("--json", default=None, metavar="OUT")
    p.set_defaults(func=run)


def _scrape(port: int) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            if s.name.endswith(("_sum", "_count")) and "iteration" in s.name:
                out[s.name] = s.value
    return out


def _delta(a: dict[str, float], b: dict[str, float], name: str) -> float:
    return b.get(name, 0.0) - a.get(name, 0.0)


def measure(stub, metrics_port: int, batch: int, iterations: int) -> dict[str, float]:
    """Keep ``batch`` requests decoding; return the per-iteration figures over the window."""
    from fastserve.proto import scheduler_pb2 as spb

    budget = iterations * 3 + 64
    req = spb.GenerateRequest(text="Tell me a long story about the sea.",
                              sampling=spb.SamplingOptions(max_tokens=budget, temperature=0.0,
                                                           ignore_eos=True))
    streams = [stub.Generate(req) for _ in range(batch)]

    def drain(s):
        try:
            for _ in s:
                pass
        except Exception:  # noqa: BLE001 - cancelled at the end of the window
            pass

    threads = [threading.Thread(target=drain, args=(s,), daemon=True) for s in streams]
    for t in threads:
        t.start()
    it = "fastserve:iteration_time_seconds_count"
    deadline = time.monotonic() + 600
    while stub.Status(spb.StatusRequest()).num_running < batch:
        assert time.monotonic() < deadline, "requests did not all start"
        time.sleep(0.05)
    start = _scrape(metrics_port)
    while _delta(start, now := _scrape(metrics_port), it) < 5:  # past every prefill
        time.sleep(0.05)
    start, t0 = now, time.monotonic()
    while _delta(start, end := _scrape(metrics_port), it) < iterations:
        time.sleep(0.2)
    wall = time.monotonic() - t0
    for s in streams:
        s.cancel()
    for t in threads:
        t.join(30)
    n = _delta(start, end, it)
    compute = _delta(start, end, "fastserve:iteration_time_seconds_sum") / n
    outside = _delta(start, end, "fastserve:iteration_overhead_seconds_sum") / n
    size = _delta(start, end, "fastserve:iteration_batch_size_sum") / n
    # Tokens over wall time: with several Steps in flight (pipeline stages) an iteration's
    # time is a Step's way through the pipe, not the time between two Steps' tokens.
    tokens = _delta(start, end, "fastserve:iteration_batch_size_sum")
    return {"batch_size": batch, "mean_batch_size": size, "iterations": n,
            "iteration_s": compute + outside, "compute_s": compute, "outside_s": outside,
            "overhead_fraction": outside / (compute + outside), "wall_s": wall,
            "wall_tokens_per_s": tokens / wall}


def run(args: argparse.Namespace) -> int:
    import grpc
    from tqdm.auto import tqdm

    from fastserve.cli_serve import start_child, stop_child
    from fastserve.models import DEFAULT_MODEL, resolve_model
    from fastserve.proto import scheduler_pb2_grpc

    model = str(resolve_model(args.model or DEFAULT_MODEL))
    metrics_port = free_port()
    worker, waddr = start_child(
        [sys.executable, "-m", "worker_svc", "--model", model, "--device", args.device,
         "--num-blocks", str(args.kv_blocks), "--listen", "127.0.0.1:0", "--log-level",
         "WARNING"], "worker listening on ", 600, name="worker")
    scheduler = None
    try:
        scheduler, saddr = start_child(
            [sys.executable, "-m", "scheduler_svc", "--model", model, "--workers", waddr,
             "--listen", "127.0.0.1:0", "--metrics-port", str(metrics_port),
             "--max-batch-size", str(max(args.batch_sizes)), "--log-level", "WARNING"],
            "scheduler listening on ", 300, name="scheduler")
        stub = scheduler_pb2_grpc.SchedulerStub(grpc.insecure_channel(saddr))
        rows = []
        for b in tqdm(args.batch_sizes, desc="batch sizes", file=sys.stderr):
            rows.append(measure(stub, metrics_port, b, args.iterations))
    finally:
        if scheduler is not None:
            stop_child(scheduler)
        stop_child(worker)
    print(f"model {args.model or DEFAULT_MODEL}  device {args.device}")
    print(f"{'batch':>5} {'iters':>6} {'iteration ms':>13} {'compute ms':>11} "
          f"{'outside ms':>11} {'overhead':>9}")
    for r in rows:
        print(f"{r['batch_size']:>5} {r['iterations']:>6.0f} {r['iteration_s'] * 1e3:>13.2f} "
              f"{r['compute_s'] * 1e3:>11.2f} {r['outside_s'] * 1e3:>11.2f} "
              f"{r['overhead_fraction']:>8.1%}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"model": args.model or DEFAULT_MODEL, "device": args.device,
                       "rows": rows}, f, indent=2)
    return 0
