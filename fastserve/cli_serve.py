"""`fastserve serve`: run a KV store, a worker, a scheduler and the OpenAI HTTP API on this
machine until Ctrl-C.

The model is resolved first (pulled and converted once, progress on stderr). Then the node's
KV store starts as a child process (unless ``--no-kvstore``), then the worker pointed at it,
then the scheduler pointed at the worker, then the HTTP front end pointed at the scheduler
(unless ``--http-port -1``); once all have printed their ready lines, one line goes to stdout:
``FastServe ready at HOST:PORT (policy P, model M; OpenAI API at http://HOST:PORT/v1)``. The
children's logs pass through to stderr. Shutdown stops the front end and the scheduler first,
so that no new work reaches the worker, then the worker, then the store (SIGTERM, then SIGKILL
after 10 s), and exits 0. A child that
dies on its own is started again on the same port after a backoff (1 s, doubled per restart
within 10 minutes) while the others keep serving; one that dies a sixth time within 10
minutes stops everything, and the command exits 1. With ``--tensor-parallel T`` and
``--pipeline-parallel P`` each worker group is T x P processes that start together and, when
any of them dies, are all stopped and started again together (the group's state died with the
one rank).
"""

from __future__ import annotations

import argparse
import collections
import os
import pathlib
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from fastserve.cpus import CpuPlan, allowed_cpus, bind_process, format_cpu_list, plan_cpus
from fastserve.metrics_endpoint import DEFAULT_HOST, HOST_HELP
from fastserve.ports import free_port
from fastserve.tls import CA_FILE, cert_files, make_local_ca
from scheduler_svc.config_args import add_config_args, config_argv, config_from_args
from worker_svc.loops import LOOP_HELP, LOOP_NGRAM, ngram_arg

KVSTORE_READY = "kvstore listening on "
WORKER_READY = "worker listening on "
FOLLOWER_READY = "worker rank "  # a worker group's other ranks: "worker rank R of T ..."
SCHEDULER_READY = "scheduler listening on "
HTTP_READY = "http listening on "
# The first start on CPU loads (and may profile) the model; later starts take seconds.
KVSTORE_START_TIMEOUT_S = 60.0
WORKER_START_TIMEOUT_S = 300.0
SCHEDULER_START_TIMEOUT_S = 120.0
HTTP_START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0
TAIL_LINES = 20


class ChildFailed(RuntimeError):
    """A child process died, or did not print its ready line in time."""


class Stopped(Exception):
    """Shutdown was requested while a child was starting."""


class Child(subprocess.Popen):
    """A child process whose stderr is copied to ours; ``tail()`` has its last lines."""

    def __init__(self, cmd: list[str]) -> None:
        # A session of its own keeps a terminal's Ctrl-C away from it, so that shutdown can
        # stop the children in order; PYTHONUNBUFFERED so its ready line is not held back.
        super().__init__(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         errors="replace", start_new_session=True,
                         env={**os.environ, "PYTHONUNBUFFERED": "1"})
        self._tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
        self._stderr_pump = _pump(self.stderr, lambda line: self._tail.append(line.rstrip("\n")))

    def tail(self) -> str:
        self._stderr_pump.join(timeout=2.0)  # lets the last lines of a dead child arrive
        return "\n".join(f"  | {line}" for line in self._tail)


SERVE_POLICY = "predictive"


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the serve command."""
    from fastserve.models import DEFAULT_MODEL

    p = sub.add_parser("serve", help="run a worker and a scheduler here until Ctrl-C")
    p.add_argument("--model", default=DEFAULT_MODEL, help=f"model (default {DEFAULT_MODEL})")
    p.add_argument("--host", default="127.0.0.1", help="address the scheduler listens on")
    p.add_argument("--port", type=int, default=50051, help="scheduler port (0 = pick one)")
    p.add_argument("--device", default="cpu", help="torch device of the worker, e.g. cuda:0")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--kv-blocks", type=int, default=2048, help="worker KV pool size in blocks")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block")
    p.add_argument("--worker-port", type=int, default=0,
                   help="worker port (0 = pick one; with --replicas, the first of consecutive "
                        "ports)")
    p.add_argument("--replicas", type=int, default=1,
                   help="workers, each with the whole model and a KV pool of its own, behind "
                        "the one scheduler (which places each request on the least loaded); "
                        "they share the node's KV store")
    p.add_argument("--tensor-parallel", type=int, default=1, metavar="T",
                   help="processes per worker group, each with 1/T of the model's heads and "
                        "MLP (T must divide the KV heads); the cores are shared among them")
    p.add_argument("--pipeline-parallel", type=int, default=1, metavar="P",
                   help="pipeline stages per worker group, each with contiguous layers (and T "
                        "ranks); P batches in flight; the cores are shared among all T x P")
    p.add_argument("--http-port", type=int, default=8000,
                   help="the OpenAI-compatible HTTP API's port, on --host (0 = pick one, "
                        "-1 = none)")
    p.add_argument("--metrics-port", type=int, default=9400,
                   help="scheduler Prometheus port; the worker uses the next one "
                        "(0 = pick any, -1 = off)")
    p.add_argument("--metrics-host", default=DEFAULT_HOST, help=HOST_HELP)
    p.add_argument("--tls-dir", default=None, metavar="DIR",
                   help="TLS everywhere with a CA and certificate for this machine kept in DIR "
                        "(made on first use); clients then pass --tls-ca DIR/ca.pem")
    p.add_argument("--insecure", action="store_true",
                   help="allow plaintext on a --host other than loopback")
    p.add_argument("--api-keys", default=None, metavar="FILE",
                   help="API keys clients must send (one per line; default: none, local use)")
    p.add_argument("--kvstore-budget", default=None, metavar="BYTES",
                   help="host memory of the node's KV store, e.g. 4GiB (default: a quarter "
                   "of RAM)")
    p.add_argument("--predictor", default="auto",
                   help="the worker's output-length predictor: auto (the artifact `fastserve "
                   "predictor train` cached for the model, if any), none, or a path")
    p.add_argument("--loop-ngram", type=ngram_arg, default=LOOP_NGRAM, metavar="N",
                   help=LOOP_HELP)
    p.add_argument("--reserve-cpus", type=int, default=0, metavar="N",
                   help="keep the first N of this machine's cores for the scheduler, the KV "
                   "store and the HTTP API, and give each worker process a slice of the rest "
                   "of its own, one PyTorch thread per core (default 0: no binding, every "
                   "worker thread on any core). A worker that shares no core keeps its pace "
                   "while a client's large request is read (docs/benchmarks.md, issue 13)")
    p.add_argument("--no-kvstore", action="store_true",
                   help="start no KV store (paused jobs' KV then stays on the device)")
    # The scheduler's own settings, passed on to it when given (its defaults otherwise),
    # except the policy: serve runs the one that did best in the real-cluster comparisons
    # (docs/benchmarks.md, issue 12); the scheduler's own default stays the fcfs baseline.
    add_config_args(p, defaults=False, overrides={"policy": SERVE_POLICY})
    p.set_defaults(func=run)


def kvstore_command(args: argparse.Namespace) -> list[str]:
    """The node KV store's command line (loopback: the worker beside it is its only client)."""
    cmd = [sys.executable, "-m", "kvstore_svc", "--listen", "127.0.0.1:0",
           "--metrics-port", str(worker_metrics_port(args.metrics_port, 2)),
           "--metrics-host", getattr(args, "metrics_host", DEFAULT_HOST),
           "--log-level", getattr(args, "log_level", "INFO")]
    if args.kvstore_budget:
        cmd += ["--budget-bytes", str(args.kvstore_budget)]
    return cmd + tls_flags(args, "kvstore")


# Each child has a certificate of its own from ``--tls-dir`` (a store tells workers apart).
TLS_ROLES = ("scheduler", "worker", "kvstore", "http")


def tls_flags(args: argparse.Namespace, role: str) -> list[str]:
    """A child's TLS flags: its certificate (``role``) and the CA from ``--tls-dir``."""
    out = ["--insecure"] if getattr(args, "insecure", False) else []
    d = getattr(args, "tls_dir", None)
    if d:
        cert, key = cert_files(d, role)
        out += ["--tls-cert", cert, "--tls-key", key,
                "--tls-ca", str(pathlib.Path(d) / CA_FILE)]
    return out


def worker_command(args: argparse.Namespace, kvstore: str | None = None,
                   index: int = 0) -> list[str]:
    """Worker ``index``'s command line; it always listens on loopback (only the scheduler
    calls it). Metrics: the first worker on the scheduler's port + 1, the store + 2, worker
    i > 0 + 2 + i."""
    port = args.worker_port + index if args.worker_port else 0
    metrics = worker_metrics_port(args.metrics_port, 1 if index == 0 else 2 + index)
    cmd = [
        sys.executable, "-m", "worker_svc", "--model", args.model, "--device", args.device,
        "--dtype", args.dtype, "--num-blocks", str(args.kv_blocks),
        "--block-size", str(args.block_size), "--listen", f"127.0.0.1:{port}",
        "--metrics-port", str(metrics),
        "--metrics-host", getattr(args, "metrics_host", DEFAULT_HOST),
        "--log-level", getattr(args, "log_level", "INFO"),
        "--predictor", getattr(args, "predictor", "auto"),
        "--loop-ngram", str(getattr(args, "loop_ngram", LOOP_NGRAM)),
    ]
    if kvstore:
        cmd += ["--kvstore", kvstore]
    return cmd + tls_flags(args, "worker")


def group_commands(args: argparse.Namespace, kvstore: str | None = None,
                   index: int = 0) -> list[list[str]]:
    """Worker group ``index``'s command lines, rank 0 first: ``--tensor-parallel`` ranks of
    each of ``--pipeline-parallel`` stages (rank r is tensor rank r mod T of stage r // T)
    meeting at a loopback rendezvous, the machine's cores divided among them. Rank 0 is
    ``worker_command``'s worker; the others serve nothing and follow it."""
    size = getattr(args, "tensor_parallel", 1)
    stages = getattr(args, "pipeline_parallel", 1)
    plan: CpuPlan | None = getattr(args, "cpu_plan", None)
    rank0 = worker_command(args, kvstore, index)
    if size * stages == 1:
        cmds = [rank0]
    else:
        # Bound ranks take one thread per core of their slice (the worker's default then).
        threads = None if plan else max(1, (os.cpu_count() or 1) // (size * stages))
        group, places = group_flags(size, stages, f"127.0.0.1:{free_port()}", threads)
        follower = list(rank0)
        for flag in ("--metrics-port", "--listen"):  # only rank 0 serves (metrics, gRPC)
            i = follower.index(flag)
            del follower[i:i + 2]
        cmds = [rank0 + group, *(follower + group + place for place in places[1:])]
    if plan is None:
        return cmds
    first = index * size * stages
    return [[*cmd, "--cpus", format_cpu_list(plan.workers[first + r])]
            for r, cmd in enumerate(cmds)]


def group_flags(size: int, stages: int, address: str,
                threads: int | None) -> tuple[list[str], list[list[str]]]:
    """The flags every rank of a T x P worker group shares (``--threads`` unless None), and
    each rank's own (rank 0's first, empty): rank r is tensor rank r mod T of pipeline stage
    r // T."""
    group = ["--tensor-parallel-size", str(size), "--group-address", address]
    if threads is not None:
        group += ["--threads", str(threads)]
    if stages > 1:
        group += ["--pipeline-parallel-size", str(stages)]
    places: list[list[str]] = [[]]
    for rank in range(1, size * stages):
        place = ["--tensor-parallel-rank", str(rank % size)]
        if stages > 1:
            place += ["--pipeline-parallel-rank", str(rank // size)]
        places.append(place)
    return group, places


def worker_metrics_port(scheduler_port: int, offset: int = 1) -> int:
    """Metrics ports follow the scheduler's: worker +1, KV store +2; any (0) or off (-1)."""
    return scheduler_port + offset if scheduler_port > 0 else scheduler_port


def scheduler_command(args: argparse.Namespace, workers: str) -> list[str]:
    """The scheduler's command line, pointed at the ``workers`` addresses, with the
    ``SchedulerConfig`` settings ``args`` holds (not None)."""
    return [
        sys.executable, "-m", "scheduler_svc", "--model", args.model, "--workers", workers,
        "--listen", f"{args.host}:{args.port}", "--metrics-port", str(args.metrics_port),
        "--metrics-host", getattr(args, "metrics_host", DEFAULT_HOST),
        *(["--api-keys", args.api_keys] if getattr(args, "api_keys", None) else []),
        *config_argv(args), *tls_flags(args, "scheduler"),
    ]


def http_command(args: argparse.Namespace, scheduler: str) -> list[str]:
    """The OpenAI HTTP front end's command line, in front of the ``scheduler`` address."""
    return [sys.executable, "-m", "openai_svc", "--scheduler", scheduler,
            "--listen", f"{args.host}:{args.http_port}", "--model", args.model,
            "--log-level", getattr(args, "log_level", "INFO"), *tls_flags(args, "http")]


def start_child(cmd: list[str], ready_prefix: str, timeout: float, *, name: str = "child",
                stop: threading.Event | None = None) -> tuple[Child, str]:
    """Start ``cmd`` and wait for its stdout line ``<ready_prefix>HOST:PORT``.

    Returns the process and HOST:PORT. Its stderr, and its other stdout lines, go to our
    stderr. Raises ``ChildFailed`` (with its last stderr lines) if it exits or is not ready
    within ``timeout`` s, and ``Stopped`` if ``stop`` is set meanwhile; either way it is gone.
    """
    [(proc, address)] = start_children([(name, cmd, ready_prefix)], timeout, stop=stop)
    return proc, address


def start_children(specs: list[tuple[str, list[str], str]], timeout: float, *,
                   stop: threading.Event | None = None) -> list[tuple[Child, str]]:
    """Start every ``(name, cmd, ready_prefix)`` at once (the ranks of a worker group are
    ready only together), then wait for each one's ready line, as ``start_child`` does for
    one; if any fails, all are stopped."""
    started: list[tuple[Child, queue.Queue[str]]] = []
    for _, cmd, prefix in specs:
        proc = Child(cmd)
        ready: queue.Queue[str] = queue.Queue()
        _pump(proc.stdout, _ready_line(prefix, ready), echo=False)
        started.append((proc, ready))
    deadline = time.monotonic() + timeout
    out = []
    try:
        for (name, _, prefix), (proc, ready) in zip(specs, started, strict=True):
            out.append((proc, _wait_ready(proc, ready, prefix, name, deadline, timeout, stop)))
    except BaseException:
        for proc, _ in started:
            stop_child(proc)
        raise
    return out


def _ready_line(prefix: str, ready: queue.Queue[str]) -> Callable[[str], None]:
    def on_stdout(line: str) -> None:
        if line.startswith(prefix) and ready.empty():
            ready.put(line[len(prefix):].strip())
            return
        sys.stderr.write(line)
        sys.stderr.flush()
    return on_stdout


def _wait_ready(proc: Child, ready: queue.Queue[str], prefix: str, name: str,
                deadline: float, timeout: float, stop: threading.Event | None) -> str:
    while True:
        try:
            return ready.get(timeout=0.1)
        except queue.Empty:
            pass
        if proc.poll() is not None and ready.empty():
            raise ChildFailed(f"{name} exited with code {proc.returncode} before it was "
                              f"ready; its last stderr lines:\n{proc.tail()}")
        if stop is not None and stop.is_set():
            raise Stopped(name)
        if time.monotonic() > deadline:
            raise ChildFailed(f"{name} not ready after {timeout:g} s (no '{prefix}...' "
                              f"line); its last stderr lines:\n{proc.tail()}")


def stop_child(p: subprocess.Popen, timeout: float = STOP_TIMEOUT_S) -> int:
    """SIGTERM ``p``, SIGKILL it if it is still there after ``timeout`` s; its exit code."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    return p.returncode


def run(args: argparse.Namespace) -> int:
    """The serve command: see the module doc."""
    from fastserve.models import resolve_model
    try:
        config_from_args(args)  # a refused setting fails here, before anything starts
        if args.replicas < 1:
            raise ValueError(f"--replicas must be at least 1, got {args.replicas}")
        if args.tensor_parallel < 1:
            raise ValueError(f"--tensor-parallel must be at least 1, got {args.tensor_parallel}")
        if args.pipeline_parallel < 1:
            raise ValueError(f"--pipeline-parallel must be at least 1, got "
                             f"{args.pipeline_parallel}")
        args.cpu_plan = None
        if args.reserve_cpus < 0:
            raise ValueError(f"--reserve-cpus must not be negative, got {args.reserve_cpus}")
        if args.reserve_cpus:
            args.cpu_plan = plan_cpus(allowed_cpus(), args.reserve_cpus, args.replicas
                                      * args.tensor_parallel * args.pipeline_parallel)
        resolve_model(args.model, progress=True)
        if getattr(args, "tls_dir", None):
            make_local_ca(args.tls_dir, TLS_ROLES)
            print(f"TLS: clients pass --tls-ca {pathlib.Path(args.tls_dir) / CA_FILE}",
                  file=sys.stderr)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.cpu_plan is not None:
        # This process's cores are inherited by the store, the scheduler and the HTTP API;
        # each worker process binds itself to its slice (--cpus).
        bind_process(args.cpu_plan.reserved)
        print(f"cores: {format_cpu_list(args.cpu_plan.reserved)} for the scheduler, store and "
              f"HTTP API; " + ", ".join(format_cpu_list(c) for c in args.cpu_plan.workers)
              + " for the worker process(es)", file=sys.stderr)
    stop = threading.Event()
    handlers = {sig: signal.signal(sig, lambda signum, frame: stop.set())
                for sig in (signal.SIGINT, signal.SIGTERM)}
    children: list[tuple[str, Child]] = []
    try:
        return _supervise(args, stop, children)
    except Stopped:
        return 0
    except ChildFailed as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    finally:
        for name, child in reversed(children):  # http, scheduler, worker, then store
            if child.poll() is None:
                print(f"stopping {name}", file=sys.stderr)
            stop_child(child)
        for sig, handler in handlers.items():
            signal.signal(sig, handler)


@dataclass
class Unit:
    """Children that live and die together: one service, or the ranks of a worker group
    (when one rank dies the group's state is gone, so all of them restart)."""

    name: str
    specs: list[tuple[str, list[str], str]]  # (name, command, ready line prefix)
    timeout: float
    procs: list[Child] = field(default_factory=list)

    def dead(self) -> Child | None:
        return next((p for p in self.procs if p.poll() is not None), None)


def _supervise(args: argparse.Namespace, stop: threading.Event,
               children: list[tuple[str, Child]]) -> int:
    """Start the children, then restart any unit one of whose processes dies (see
    ``Restarts``) until ``stop``."""
    units: list[Unit] = []

    def start(name: str, cmds: list[list[str]], ready: str, timeout: float) -> str:
        names = [name] if len(cmds) == 1 else [f"{name}-rank{r}" for r in range(len(cmds))]
        prefixes = [ready] + [FOLLOWER_READY] * (len(cmds) - 1)
        unit = Unit(name, list(zip(names, cmds, prefixes, strict=True)), timeout)
        started = start_children(unit.specs, timeout, stop=stop)
        unit.procs = [p for p, _ in started]
        children.extend(zip(names, unit.procs, strict=True))
        address = started[0][1]
        # A restart must come back where the others look for it: on the port it got.
        unit.specs[0] = (names[0], pinned(cmds[0], address), ready)
        units.append(unit)
        return address

    store_address = None
    if not args.no_kvstore:
        store_address = start("kvstore", [kvstore_command(args)], KVSTORE_READY,
                              KVSTORE_START_TIMEOUT_S)
    workers = [start("worker" if args.replicas == 1 else f"worker{i}",
                     group_commands(args, store_address, i), WORKER_READY,
                     WORKER_START_TIMEOUT_S) for i in range(args.replicas)]
    address = start("scheduler", [scheduler_command(args, ",".join(workers))], SCHEDULER_READY,
                    SCHEDULER_START_TIMEOUT_S)
    http = ""
    if args.http_port >= 0:
        http_address = start("http", [http_command(args, address)], HTTP_READY,
                             HTTP_START_TIMEOUT_S)
        scheme = "https" if getattr(args, "tls_dir", None) else "http"
        http = f"; OpenAI API at {scheme}://{http_address}/v1"
    policy = config_from_args(args).policy
    print(f"FastServe ready at {address} (policy {policy}, model {args.model}{http})",
          flush=True)
    restarts = Restarts(RESTART_LIMIT, RESTART_WINDOW_S, RESTART_BACKOFF_S)
    while not stop.wait(0.5):
        for unit in units:
            dead = unit.dead()
            if dead is None:
                continue
            delay = restarts.next_delay(unit.name)  # raises ChildFailed past the limit
            dead_name = unit.specs[unit.procs.index(dead)][0]
            others = " with the rest of its group" if len(unit.procs) > 1 else ""
            print(f"{dead_name} exited unexpectedly with code {dead.returncode}; restarting "
                  f"it{others} in {delay:.0f} s (the others keep serving). Its last stderr "
                  f"lines:\n{dead.tail()}", file=sys.stderr, flush=True)
            for p in unit.procs:
                stop_child(p)
            if stop.wait(delay):
                return 0
            started = start_children(unit.specs, unit.timeout, stop=stop)
            for old, (new, _) in zip(unit.procs, started, strict=True):
                i = next(k for k, (_, c) in enumerate(children) if c is old)
                children[i] = (children[i][0], new)
            unit.procs = [p for p, _ in started]
            print(f"{unit.name} restarted", file=sys.stderr, flush=True)
    return 0


RESTART_LIMIT = 5  # restarts of one child within RESTART_WINDOW_S, then serve gives up
RESTART_WINDOW_S = 600.0
RESTART_BACKOFF_S = 1.0  # doubled per recent restart


class Restarts:
    """Backoff and limit per child: a child that keeps dying is not restarted forever."""

    def __init__(self, limit: int, window_s: float, backoff_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.window_s, self.backoff_s, self.clock = limit, window_s, backoff_s, clock
        self._times: dict[str, collections.deque[float]] = {}

    def next_delay(self, name: str) -> float:
        now = self.clock()
        recent = self._times.setdefault(name, collections.deque())
        while recent and recent[0] < now - self.window_s:
            recent.popleft()
        if len(recent) >= self.limit:
            raise ChildFailed(f"{name} died {len(recent) + 1} times within "
                              f"{self.window_s:.0f} s; not restarting it again")
        recent.append(now)
        return self.backoff_s * 2 ** (len(recent) - 1)


def pinned(cmd: list[str], address: str) -> list[str]:
    """``cmd`` with its ``--listen`` port set to the one ``address`` (HOST:PORT) names."""
    port = address.rsplit(":", 1)[1]
    out = list(cmd)
    if "--listen" not in out:
        return out
    i = out.index("--listen")
    out[i + 1] = f"{out[i + 1].rsplit(':', 1)[0]}:{port}"
    return out


def _pump(stream, on_line, echo: bool = True) -> threading.Thread:  # type: ignore[no-untyped-def]
    """Copy ``stream``'s lines to our stderr (``echo``) and to ``on_line``, in a thread."""

    def copy() -> None:
        for line in stream:
            if echo:
                sys.stderr.write(line)
                sys.stderr.flush()
            on_line(line)

    thread = threading.Thread(target=copy, daemon=True)
    thread.start()
    return thread
