"""``python -m kvstore_svc``: this node's host-memory KV block store, until SIGTERM or SIGINT.

Logs go to stderr. Once the server is bound, one line goes to stdout: ``kvstore listening on
HOST:PORT`` (with port 0, the port actually bound). With ``--metrics-port``, Prometheus metrics
are served on 127.0.0.1:PORT/metrics (``--metrics-host`` to change the address) and a stderr
line ``metrics on :PORT`` is written before the ``kvstore listening`` line. On SIGTERM or SIGINT
the health status turns NOT_SERVING, in-flight RPCs get 5 s to finish, the shared-memory segment
is unlinked and the process exits 0.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import signal
import sys
import threading

from grpc_health.v1 import health

from fastserve.metrics_endpoint import DEFAULT_HOST, HOST_HELP
from fastserve.tls import add_tls_args, tls_from_args
from kvstore_svc.metrics import StoreMetrics
from kvstore_svc.pool import BlockPool
from kvstore_svc.server import create_server, reap_expired
from kvstore_svc.shm import SharedSegment

SHUTDOWN_GRACE_S = 5.0
# How often, at most, expired leases are reaped (a quarter of the TTL when that is shorter).
REAP_INTERVAL_S = 1.0

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9,
          "gb": 10**9, "t": 10**12, "tb": 10**12, "ki": 2**10, "kib": 2**10, "mi": 2**20,
          "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """``"8GiB"`` -> 8589934592: a number with an optional unit, decimal (kB, MB, GB, TB, and
    K, M, G, T) or binary (KiB, MiB, GiB, TiB, and Ki, Mi, Gi, Ti), case-insensitive."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    unit = m and _UNITS.get(m[2].lower())
    if not m or unit is None:
        raise argparse.ArgumentTypeError(
            f"expected bytes like 1073741824, 8GiB or 512MB, got {text!r}")
    value = int(float(m[1]) * unit)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def total_memory_bytes() -> int:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m kvstore_svc", description=__doc__.splitlines()[0])
    p.add_argument("--listen", default="127.0.0.1:50071", help="HOST:PORT; port 0 picks one")
    p.add_argument("--budget-bytes", type=parse_bytes, default=None,
                   help="pool size, e.g. 8GiB (default: --budget-fraction of total memory)")
    p.add_argument("--budget-fraction", type=float, default=0.25,
                   help="pool size as a fraction of total memory, without --budget-bytes")
    p.add_argument("--block-bytes", type=parse_bytes, default=None,
                   help="bytes per block (default: fixed by the first client to register)")
    p.add_argument("--lease-ttl-s", type=float, default=10.0,
                   help="seconds a client's lease lives without a KeepAlive")
    p.add_argument("--metrics-port", type=int, default=-1,
                   help="serve Prometheus /metrics on this port (0 = any free port, -1 = off)")
    p.add_argument("--metrics-host", default=DEFAULT_HOST, help=HOST_HELP)
    add_tls_args(p)
    p.add_argument("--log-level", default="INFO")
    args = p.parse_args(argv)
    if args.budget_bytes is None:
        if not 0 < args.budget_fraction <= 1:
            p.error(f"--budget-fraction must be in (0, 1], got {args.budget_fraction}")
        args.budget_bytes = int(total_memory_bytes() * args.budget_fraction)
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    log = logging.getLogger("kvstore_svc")

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())

    try:
        pool = BlockPool(args.budget_bytes, SharedSegment, block_bytes=args.block_bytes,
                         lease_ttl_s=args.lease_ttl_s)
    except (ValueError, OSError) as e:  # bad settings or no room in /dev/shm: say why
        log.error("%s", e)
        return 2
    # From here on the segment (once created) must be unlinked however we leave.
    try:
        return _serve(args, pool, stop)
    finally:
        pool.close()


def _serve(args: argparse.Namespace, pool: BlockPool, stop: threading.Event) -> int:
    log = logging.getLogger("kvstore_svc")
    stats = pool.stats()
    sized = (f"{stats.capacity_blocks} blocks of {stats.block_bytes} bytes in "
             f"{stats.segment_name}" if stats.segment_name else "sized by the first client")
    log.info("budget %d bytes, %s, lease TTL %g s", pool.budget_bytes, sized, args.lease_ttl_s)
    metrics = None
    try:
        tls = tls_from_args(args)
    except (OSError, ValueError) as e:
        log.error("%s", e)
        return 2
    if args.metrics_port >= 0:
        metrics = StoreMetrics(pool)
        try:
            log.info("metrics on :%d", metrics.serve(args.metrics_port, args.metrics_host))
        except OSError as e:
            log.error("cannot serve metrics on port %d: %s", args.metrics_port, e)
            return 1
    health_servicer = health.HealthServicer()
    try:
        server, port = create_server(pool, args.listen, health_servicer=health_servicer,
                                     metrics=metrics, tls=tls)
    except RuntimeError as e:
        log.error("cannot listen on %s: %s", args.listen, e)
        return 1
    host = args.listen.rsplit(":", 1)[0]
    print(f"kvstore listening on {host}:{port}", flush=True)
    # A timed wait keeps the main thread responsive to signals, and reaps expired leases.
    while not stop.wait(min(REAP_INTERVAL_S, args.lease_ttl_s / 4)):
        reap_expired(pool, metrics)
    log.info("shutting down")
    health_servicer.enter_graceful_shutdown()
    server.stop(grace=SHUTDOWN_GRACE_S).wait()
    if metrics is not None:
        metrics.close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
