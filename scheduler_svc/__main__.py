"""`python -m scheduler_svc`: the FastServe scheduler service."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys

from fastserve.metrics_endpoint import DEFAULT_HOST, HOST_HELP
from fastserve.models import DEFAULT_MODEL, resolve_model
from fastserve.tls import add_tls_args, tls_from_args
from scheduler_svc.api.auth import ApiKeys
from scheduler_svc.config_args import add_config_args, config_from_args

log = logging.getLogger("scheduler_svc")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m scheduler_svc", description=__doc__)
    p.add_argument("--model", default=DEFAULT_MODEL,
                   help="model whose tokenizer and chat template to use (the workers' model)")
    p.add_argument("--workers", default=None,
                   help="worker addresses, comma-separated (static discovery)")
    p.add_argument("--discovery", choices=["static", "kubernetes"], default="static",
                   help="static: --workers; kubernetes: the Ready pods --worker-selector "
                        "matches, through the Kubernetes API")
    p.add_argument("--worker-selector", default=None, metavar="LABELS",
                   help="with --discovery kubernetes: a label selector, e.g. "
                        "app.kubernetes.io/component=worker,app.kubernetes.io/instance=fs")
    p.add_argument("--namespace", default=None,
                   help="with --discovery kubernetes: default the pod's service account's")
    p.add_argument("--kubeconfig", default=None, metavar="FILE",
                   help="with --discovery kubernetes: a kubeconfig instead of the pod's "
                        "service account")
    p.add_argument("--worker-port", type=int, default=50061,
                   help="with --discovery kubernetes: the port of a pod that names no "
                        "container port 'grpc'")
    p.add_argument("--listen", default="127.0.0.1:50051", help="HOST:PORT (port 0 = any)")
    p.add_argument("--metrics-port", type=int, default=9400, help="0 = any free port, -1 = off")
    p.add_argument("--metrics-host", default=DEFAULT_HOST, help=HOST_HELP)
    p.add_argument("--api-keys", default=None, metavar="FILE",
                   help="API keys clients must send as 'authorization: Bearer <key>', one per "
                        "line (default: none, every client that reaches --listen is served)")
    p.add_argument("--connect-timeout", type=float, default=120.0,
                   help="seconds to wait for every worker at start")
    p.add_argument("--log-level", default="INFO")
    add_tls_args(p)
    add_config_args(p)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


async def serve(args: argparse.Namespace) -> int:
    from scheduler_svc.discovery import default_namespace
    from scheduler_svc.server import Discovery, create_service

    config = config_from_args(args)
    workers = [w.strip() for w in (args.workers or "").split(",") if w.strip()]
    discovery = None
    if args.discovery == "kubernetes":
        if not args.worker_selector:
            log.error("--discovery kubernetes needs --worker-selector")
            return 2
        discovery = Discovery(args.namespace or default_namespace(), args.worker_selector,
                              args.worker_port, args.kubeconfig)
    elif not workers:
        log.error("--workers: at least one worker address is needed (or --discovery "
                  "kubernetes)")
        return 2
    try:
        api_keys = ApiKeys.load(args.api_keys) if args.api_keys else None
    except (OSError, ValueError) as e:
        log.error("--api-keys %s: %s", args.api_keys, e)
        return 2
    try:
        tls = tls_from_args(args)
    except (OSError, ValueError) as e:
        log.error("%s", e)
        return 2
    if api_keys is None:
        log.warning("no --api-keys: every client that reaches %s is served (local use only)",
                    args.listen)
    else:
        log.info("%d API keys: clients without one are refused", len(api_keys))
    model_path = str(await asyncio.to_thread(resolve_model, args.model))
    service = await create_service(config, model_path, args.model, workers, args.listen,
                                   args.connect_timeout, args.metrics_port, args.metrics_host,
                                   api_keys=api_keys, tls=tls, discovery=discovery)
    host = args.listen.rsplit(":", 1)[0]
    metrics = f", metrics on :{service.metrics.port}" if service.metrics else ""
    found = (f"pods of {discovery.namespace} matching {discovery.selector}" if discovery
             else ", ".join(workers))
    log.info("policy %s, workers %s%s", config.policy, found, metrics)
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
