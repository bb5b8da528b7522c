"""Start FastServe services as real processes for tests, and stop them."""

from __future__ import annotations

import os
import pathlib
import select
import signal
import subprocess
import sys
import time
import urllib.request

from fastserve.ports import free_port

ROOT = pathlib.Path(__file__).resolve().parents[1]


class ServiceProcess:
    """``python -m MODULE ARGS``; ready when stdout prints ``<prefix> HOST:PORT``."""

    def __init__(self, module: str, args: list[str], ready_prefix: str, log_path: pathlib.Path,
                 timeout_s: float = 180.0, env: dict[str, str] | None = None,
                 prefix: list[str] | None = None):
        """``prefix`` goes before the interpreter, e.g. ``ip netns exec NAME``."""
        self.log_path = log_path
        full_env = {**os.environ, **(env or {})}
        with open(log_path, "w") as log:
            self.proc = subprocess.Popen([*(prefix or []), sys.executable, "-m", module, *args],
                                         cwd=ROOT,
                                         env=full_env, stdout=subprocess.PIPE, stderr=log,
                                         text=True)
        deadline = time.monotonic() + timeout_s
        line = ""
        while time.monotonic() < deadline and self.proc.poll() is None:
            ready, _, _ = select.select([self.proc.stdout], [], [], 0.5)
            if ready:
                line = self.proc.stdout.readline().strip()
                if line.startswith(ready_prefix):
                    break
        if not line.startswith(ready_prefix):
            self.stop()
            raise RuntimeError(f"{module} did not become ready: {line!r}\n{self.log()}")
        self.address = line.rsplit(" ", 1)[1]

    def log(self) -> str:
        return self.log_path.read_text()[-4000:]

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait(10)

    def stop(self, timeout_s: float = 15.0) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return self.proc.returncode


def start_worker(model: str, log_dir: pathlib.Path, num_blocks: int = 512, name: str = "worker",
                 *extra: str) -> ServiceProcess:
    args = ["--model", model, "--num-blocks", str(num_blocks), "--listen", "127.0.0.1:0", *extra]
    return ServiceProcess("worker_svc", args, "worker listening on", log_dir / f"{name}.log")


def start_group(model: str, log_dir: pathlib.Path, size: int, num_blocks: int = 512,
                name: str = "worker", *extra: str, stages: int = 1) -> list[ServiceProcess]:
    """A worker group of ``size`` tensor-parallel ranks x ``stages`` pipeline stages; rank 0
    (first in the list) serves gRPC, the others follow in rank order (stage by stage). The
    ranks start together: each is ready only once all have joined."""
    import concurrent.futures

    from fastserve.cli_serve import group_flags

    world = size * stages
    group, places = group_flags(size, stages, f"127.0.0.1:{free_port()}",
                                max(1, (os.cpu_count() or 1) // world))

    def rank(r: int) -> ServiceProcess:
        if r == 0:
            return start_worker(model, log_dir, num_blocks, f"{name}-rank0", *group, *extra)
        args = ["--model", model, "--num-blocks", str(num_blocks), *group, *places[r], *extra]
        return ServiceProcess("worker_svc", args, "worker rank", log_dir / f"{name}-rank{r}.log")

    with concurrent.futures.ThreadPoolExecutor(world) as pool:
        futures = [pool.submit(rank, r) for r in range(world)]
        procs, errors = [], []
        for f in futures:
            try:
                procs.append(f.result())
            except RuntimeError as e:
                errors.append(e)
    if errors:
        for p in procs:
            p.stop()
        raise errors[0]
    return procs


def start_kvstore(log_dir: pathlib.Path, budget_bytes: int | str, *extra: str,
                  name: str = "kvstore") -> ServiceProcess:
    """``python -m kvstore_svc`` on a free port (a later ``--listen`` in ``extra`` wins)."""
    args = ["--listen", "127.0.0.1:0", "--budget-bytes", str(budget_bytes), *extra]
    return ServiceProcess("kvstore_svc", args, "kvstore listening on", log_dir / f"{name}.log")


def start_scheduler(model: str, workers: list[str], log_dir: pathlib.Path, *extra: str,
                    name: str = "scheduler") -> ServiceProcess:
    args = ["--model", model, "--workers", ",".join(workers), "--listen", "127.0.0.1:0",
            "--metrics-port", "-1", *extra]
    return ServiceProcess("scheduler_svc", args, "scheduler listening on",
                          log_dir / f"{name}.log")


def start_http(scheduler: str, log_dir: pathlib.Path, *extra: str,
               name: str = "http") -> ServiceProcess:
    """``python -m openai_svc`` in front of ``scheduler``, on a free port."""
    args = ["--scheduler", scheduler, "--listen", "127.0.0.1:0", *extra]
    return ServiceProcess("openai_svc", args, "http listening on", log_dir / f"{name}.log")


def scrape_metrics(port: int) -> dict[tuple[str, frozenset], float]:
    """Every sample on a service's ``/metrics``, keyed by sample name and labels."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as r:
        text = r.read().decode()
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }

