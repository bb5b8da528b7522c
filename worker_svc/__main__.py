"""``python -m worker_svc``: load a model and serve it over gRPC until SIGTERM or SIGINT.

Logs go to stderr. Once the model is loaded (and profiled, with ``--profile-at-start``) and the
server is bound, one line goes to stdout: ``worker listening on HOST:PORT`` (with port 0, the
port actually bound). With ``--metrics-port``, Prometheus metrics are served on
127.0.0.1:PORT/metrics (``--metrics-host`` to change the address) and a stderr log line
``metrics on :PORT`` (the port actually bound) is written before the ``worker listening`` line.
With ``--kvstore HOST:PORT`` the worker offloads KV blocks to that store (connecting in the
background: a store that is not up yet fails swaps UNAVAILABLE until it is). On SIGTERM or
SIGINT the health status turns NOT_SERVING, in-flight RPCs get 5 s to finish, the store lease is
released, and the process exits 0.

In a worker group of T tensor-parallel ranks x P pipeline stages (``--tensor-parallel-size T
--pipeline-parallel-size P``) every rank loads its shard (its heads of its stage's layers) and
joins the group at ``--group-address``; the group's rank 0 (tensor rank 0 of stage 0) then serves
as above (and stops the others on the way out), while every other rank prints ``worker rank R of
N following HOST:PORT`` (R = stage x T + tensor rank, N = T x P) and runs rank 0's Steps until
it stops them. When the group is lost (a rank dead, hung or unreachable) every rank exits 75.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading

from fastserve.metrics_endpoint import DEFAULT_HOST, HOST_HELP
from fastserve.models import DEFAULT_MODEL
from fastserve.tls import add_tls_args, check_plaintext, tls_from_args
from worker_svc.loops import LOOP_HELP, LOOP_NGRAM, ngram_arg

SHUTDOWN_GRACE_S = 5.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m worker_svc", description=__doc__.splitlines()[0])
    p.add_argument(
        "--model",
        default=DEFAULT_MODEL,
        help=f"model name, HF directory, .gguf file or hub id (default {DEFAULT_MODEL})",
    )
    p.add_argument("--device", default="cpu", help="torch device, e.g. cpu or cuda:0")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--num-blocks", type=int, default=2048, help="KV pool size in blocks")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--linear-kernel", default="auto",
                   choices=["auto", "blas", "onednn", "tiled"],
                   help="CPU matmul kernel of the linears (auto: the fastest here for each "
                   "band of row counts, timed at load)")
    p.add_argument(
        "--max-context",
        type=int,
        default=None,
        help="longest job in tokens (default: the model's max positions)",
    )
    p.add_argument("--listen", default="127.0.0.1:50061", help="HOST:PORT; port 0 picks one")
    p.add_argument(
        "--kvstore",
        default=None,
        metavar="HOST:PORT",
        help="the node's KV store to offload KV blocks to (default: none, swaps fail "
        "UNAVAILABLE); if it is unreachable at start, the worker starts anyway and retries",
    )
    p.add_argument(
        "--kvstore-client-id",
        default=None,
        help="this worker's name at the store (default: HOSTNAME:PID)",
    )
    p.add_argument(
        "--predictor",
        default="auto",
        help="output-length predictor artifact: auto (the one `fastserve predictor train` "
        "cached for this model, if any), none, or a path",
    )
    p.add_argument("--loop-ngram", type=ngram_arg, default=LOOP_NGRAM, metavar="N",
                   help=LOOP_HELP)
    p.add_argument(
        "--profile-at-start",
        action="store_true",
        help="profile (or load the cached profile) before serving",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=-1,
        help="serve Prometheus /metrics on this port (0 = any free port, -1 = off)",
    )
    p.add_argument("--metrics-host", default=DEFAULT_HOST, help=HOST_HELP)
    p.add_argument("--threads", type=int, default=None,
                   help="PyTorch threads of this process (default: one per core, or per core "
                   "of --cpus); with several ranks on one machine, the cores divided among them")
    p.add_argument("--cpus", default=None, metavar="LIST",
                   help="run only on these cores, e.g. 2-5 or 1,3 (default: wherever the OS "
                   "puts it); `fastserve serve --reserve-cpus` gives each worker process its own")
    g = p.add_argument_group("tensor and pipeline parallelism (a worker group of several "
                             "processes)")
    g.add_argument("--tensor-parallel-size", type=int, default=1,
                   help="ranks in this worker group; must divide the model's KV heads")
    g.add_argument("--tensor-parallel-rank", type=int, default=0,
                   help="this process's rank; only rank 0 serves gRPC (--listen), the others "
                   "follow it")
    g.add_argument("--pipeline-parallel-size", type=int, default=1,
                   help="pipeline stages in this worker group, each with contiguous layers "
                   "and a tensor-parallel set of ranks; at most the model's layers")
    g.add_argument("--pipeline-parallel-rank", type=int, default=0,
                   help="this process's stage; only stage 0's rank 0 serves gRPC")
    g.add_argument("--group-address", default="127.0.0.1:29500", metavar="HOST:PORT",
                   help="the group's rendezvous, bound by rank 0 (a torch.distributed "
                   "TCPStore: keep it on a network only the group's hosts reach)")
    g.add_argument("--group-timeout-s", type=float, default=30.0,
                   help="a collective that takes longer declares the group lost")
    add_tls_args(p)
    p.add_argument("--log-level", default="INFO")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(),
        stream=sys.stderr,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    log = logging.getLogger("worker_svc")

    if args.cpus is not None:
        # First, before any thread of PyTorch or gRPC exists: they inherit it.
        from fastserve.cpus import bind_process, format_cpu_list, parse_cpu_list
        try:
            cpus = parse_cpu_list(args.cpus)
            bind_process(cpus)
        except ValueError as e:
            log.error("%s", e)
            return 2
        if args.threads is None:
            args.threads = len(cpus)
        log.info("on cores %s with %d PyTorch thread(s)", format_cpu_list(cpus), args.threads)

    stop = threading.Event()
    # Installed before the slow model load so that an early SIGTERM still exits cleanly.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda signum, frame: stop.set())

    from grpc_health.v1 import health

    from worker_svc import profiler
    from worker_svc.compute_thread import ComputeThread
    from worker_svc.loader import EngineConfig, load_engine
    from worker_svc.metrics import WorkerMetrics
    from worker_svc.parallel.follower import follow
    from worker_svc.parallel.group import EXIT_GROUP_LOST, GroupLayout
    from worker_svc.parallel.layout import exit_group_lost
    from worker_svc.parallel.pipeline import follow_stage
    from worker_svc.server import create_server

    try:
        tls = tls_from_args(args)
        grouped = args.tensor_parallel_size * args.pipeline_parallel_size > 1
        if grouped:  # gloo's traffic has no TLS and no authentication
            check_plaintext(args.group_address, None, args.insecure)
    except (OSError, ValueError) as e:
        log.error("%s", e)
        return 2
    try:
        layout = GroupLayout(args.tensor_parallel_rank, args.tensor_parallel_size,
                             args.group_address if grouped else "", args.group_timeout_s,
                             args.pipeline_parallel_rank, args.pipeline_parallel_size)
        cfg = EngineConfig(
            model=args.model,
            device=args.device,
            dtype=args.dtype,
            num_blocks=args.num_blocks,
            block_size=args.block_size,
            linear_kernel=args.linear_kernel,
            max_context=args.max_context,
            kvstore=args.kvstore,
            kvstore_client_id=args.kvstore_client_id or f"{socket.gethostname()}:{os.getpid()}",
            predictor=args.predictor,
            loop_ngram=args.loop_ngram,
            kvstore_tls=tls,
            group=layout,
            threads=args.threads,
        )
        # Loaded on the thread that will run every Step (see compute_thread.py).
        compute = ComputeThread()
        loaded = compute.run(load_engine, cfg)
    except ValueError as e:  # bad settings or an unusable model: say why, no traceback
        log.error("%s", e)
        return 2
    if not layout.leader:
        # A follower serves nothing: it runs rank 0's Steps until told to stop or the group
        # is lost. A signal ends it at once (its state dies with the group anyway).
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, signal.SIG_DFL)
        print(f"worker rank {layout.global_rank} of {layout.world_size} following "
              f"{args.group_address}", flush=True)
        run = follow_stage if layout.pipelined else follow
        status = compute.run(run, loaded.engine)
        if status == EXIT_GROUP_LOST:
            exit_group_lost()  # as rank 0 does (server.group_lost)
        return status
    if stop.is_set():
        return 0
    if args.profile_at_start:
        profile = compute.run(profiler.get_profile, loaded.engine, loaded.model_path)
        log.info("profile %s (%s)", profile.cache_key, "cached" if profile.cached else "measured")
    metrics = None
    if args.metrics_port >= 0:
        metrics = WorkerMetrics(loaded.engine)
        try:
            metrics_port = metrics.serve(args.metrics_port, args.metrics_host)
        except OSError as e:
            log.error("cannot serve metrics on port %d: %s", args.metrics_port, e)
            return 1
        log.info("metrics on :%d", metrics_port)
    health_servicer = health.HealthServicer()
    try:
        server, port = create_server(
            loaded,
            args.listen,
            model_arg=args.model,
            health_servicer=health_servicer,
            on_step=metrics.observe_step if metrics is not None else None,
            compute=compute,
            tls=tls,
        )
    except RuntimeError as e:
        log.error("cannot listen on %s: %s", args.listen, e)
        return 1
    host = args.listen.rsplit(":", 1)[0]
    print(f"worker listening on {host}:{port}", flush=True)
    while not stop.wait(1.0):  # a timed wait keeps the main thread responsive to signals
        pass
    log.info("shutting down")
    health_servicer.enter_graceful_shutdown()
    server.stop(grace=SHUTDOWN_GRACE_S).wait()
    if loaded.engine.group is not None:  # the followers stop with rank 0
        from worker_svc.parallel.group import GroupLost
        engine = loaded.engine
        stop_followers = (engine.pipeline.submit if engine.pipeline is not None
                          else engine.group.send_command)
        try:
            compute.run(stop_followers, None)
        except GroupLost as e:
            log.info("the group's other ranks are gone already (%s)", e)
    loaded.engine.swap.close()
    log.info("stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
