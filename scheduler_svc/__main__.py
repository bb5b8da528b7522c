"""`python -m scheduler_svc`: the FastServe scheduler service."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from fastserve.models import DEFAULT_MODEL, resolve_model
from scheduler_svc.core.config import KV_POLICIES, SchedulerConfig
from scheduler_svc.core.policy import POLICIES
from scheduler_svc.server import create_service

log = logging.getLogger("scheduler_svc")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m scheduler_svc", description=__doc__)
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="model whose tokenizer and chat template to use (the workers' model)")
    p.add_argument("--workers", required=True, help="worker addresses, comma-separated")
    p.add_argument("--listen", default="127.0.0.1:50051", help="HOST:PORT (port 0 = any)")
    p.add_argument("--policy", default="fcfs", choices=sorted(POLICIES))
    p.add_argument("--metrics-port", type=int, default=9400, help="0 = any free port, -1 = off")
    d = SchedulerConfig()
    p.add_argument("--max-batch-size", type=int, default=d.max_batch_size)
    p.add_argument("--max-batched-tokens", type=int, default=d.max_batched_tokens)
    p.add_argument("--max-waiting", type=int, default=d.max_waiting)
    p.add_argument("--default-max-tokens", type=int, default=d.default_max_tokens)
    p.add_argument("--mlfq-num-queues", type=int, default=d.mlfq_num_queues)
    p.add_argument("--mlfq-ratio", type=float, default=d.mlfq_ratio,
                   help="quantum ratio between consecutive queues")
    p.add_argument("--mlfq-q1-quantum", type=float, default=None,
                   help="Q1 quantum in seconds (default: the worker's one-decode time)")
    p.add_argument("--starve-limit", type=float, default=d.starve_limit_s,
                   help="seconds without running before a job is promoted to Q1")
    p.add_argument("--kv-policy", default=d.kv_policy, choices=list(KV_POLICIES),
                   help="what happens to paused jobs' KV when device blocks run short "
                   "(proactive offload/upload through the node's KV store, reactive swaps, "
                   "recompute, or defer new jobs)")
    p.add_argument("--kv-headroom-window", type=float, default=d.kv_headroom_window_s,
                   help="proactive headroom: free blocks for the prompts of this many "
                   "seconds of recent arrivals")
    p.add_argument("--connect-timeout", type=float, default=120.0,
                   help="seconds to wait for every worker at start")
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    config = SchedulerConfig(
        policy=args.policy, max_batch_size=args.max_batch_size,
        max_batched_tokens=args.max_batched_tokens, max_waiting=args.max_waiting,
        default_max_tokens=args.default_max_tokens, mlfq_num_queues=args.mlfq_num_queues,
        mlfq_ratio=args.mlfq_ratio, mlfq_q1_quantum_s=args.mlfq_q1_quantum,
        starve_limit_s=args.starve_limit, kv_policy=args.kv_policy,
        kv_headroom_window_s=args.kv_headroom_window,
    )
    workers = [w.strip() for w in args.workers.split(",") if w.strip()]
    model_path = str(await asyncio.to_thread(resolve_model, args.model))
    service = await create_service(config, model_path, args.model, workers, args.listen,
                                   args.connect_timeout, args.metrics_port)
    host = args.listen.rsplit(":", 1)[0]
    metrics = f", metrics on :{service.metrics.port}" if service.metrics else ""
    log.info("policy %s, workers %s%s", config.policy, ", ".join(workers), metrics)
    print(f"scheduler listening on {host}:{service.port}", flush=True)
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        asyncio.get_running_loop().add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("shutting down")
    await service.stop()
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        return asyncio.run(serve(args))
    except ValueError as e:
        log.error("%s", e)
        return 2


if __name__ == "__main__":
    sys.exit(main())
