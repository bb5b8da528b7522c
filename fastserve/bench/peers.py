"""Peer servers for `fastserve bench compare`: OpenAI-compatible systems run beside FastServe.

A peer is a name, the URL of its OpenAI-compatible API and, optionally, the shell command that
starts it. With a command, each run gets a fresh server: started in its own session (so the
whole process tree can be stopped), ready once ``/v1/models`` answers, stopped after the run.
Its output goes to a log file whose tail is shown when it fails to start.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fastserve.bench.openai_backend import base_url, replay_openai_async
from fastserve.bench.prompts import Prompt
from fastserve.traces import TraceRequest

STOP_GRACE_S = 30.0
POLL_S = 1.0


@dataclass(frozen=True)
class Peer:
    name: str
    url: str
    command: str | None = None
    model: str | None = None

    def run(self, trace: Sequence[TraceRequest], prompts: Sequence[Prompt],
            args: argparse.Namespace, desc: str) -> dict[str, Any]:
        """Replay ``trace`` against this peer (started fresh when it has a command)."""
        proc = self.start(args.peer_start_timeout) if self.command else None
        try:
            return asyncio.run(replay_openai_async(
                self.url, trace, prompts, model=self.model, name=self.name,
                timeout_s=args.timeout_s, warmup=args.warmup, progress=not args.no_progress,
                desc=desc))
        finally:
            if proc is not None:
                stop(proc)

    def start(self, timeout_s: float) -> subprocess.Popen:
        """Start the command; return once ``/v1/models`` answers. Raises ``TimeoutError`` or
        ``ConnectionError`` (with the log's tail) when it does not come up."""
        with tempfile.NamedTemporaryFile(prefix=f"fastserve-peer-{self.name}-", suffix=".log",
                                         delete=False) as log:
            proc = subprocess.Popen(self.command, shell=True, start_new_session=True,
                                    stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + timeout_s
        models = base_url(self.url) + "/models"
        while True:
            if proc.poll() is not None:
                raise ConnectionError(f"peer {self.name} exited with code {proc.returncode} "
                                      f"before serving; log {log.name}:\n{_tail(log.name)}")
            try:
                with urllib.request.urlopen(models, timeout=5) as r:
                    if r.status == 200:
                        return proc
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                stop(proc)
                raise TimeoutError(f"peer {self.name} did not answer {models} within "
                                   f"{timeout_s:g} s; log {log.name}:\n{_tail(log.name)}")
            time.sleep(POLL_S)


def stop(proc: subprocess.Popen) -> None:
    """SIGTERM the peer's whole process group, SIGKILL it after a grace period."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    except ProcessLookupError:
        pass


def peer_specs(peers: Sequence[str], commands: Sequence[str],
               models: Sequence[str]) -> list[Peer]:
    """``--peer NAME=URL``, ``--peer-cmd NAME=COMMAND`` and ``--peer-model NAME=MODEL`` ->
    peers in the order given; raises ValueError naming the bad option."""
    def pairs(option: str, items: Sequence[str]) -> dict[str, str]:
        out: dict[str, str] = {}
        for item in items:
            name, sep, value = item.partition("=")
            if not sep or not name.strip() or not value.strip():
                raise ValueError(f"{option} must be NAME=VALUE, got {item!r}")
            if name.strip() in out:
                raise ValueError(f"{option} names {name.strip()!r} twice")
            out[name.strip()] = value.strip()
        return out

    urls = pairs("--peer", peers)
    for option, given in (("--peer-cmd", pairs("--peer-cmd", commands)),
                          ("--peer-model", pairs("--peer-model", models))):
        unknown = sorted(set(given) - set(urls))
        if unknown:
            raise ValueError(f"{option} names {', '.join(unknown)}, which no --peer defines")
    cmds, mods = pairs("--peer-cmd", commands), pairs("--peer-model", models)
    return [Peer(name, url, cmds.get(name), mods.get(name)) for name, url in urls.items()]


def _tail(path: str, n: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(f.readlines()[-n:])
    except OSError:
        return ""
