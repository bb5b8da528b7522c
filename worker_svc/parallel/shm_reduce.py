"""A shared-memory all-reduce for the ranks of a group that share one host.

gloo sums over TCP: on this 2-core VM one all-reduce of a decode step's ``[8, 576]`` partial
took ~1 ms between 2 processes and ~3 ms among 3, and a Llama forward needs two per layer.
Ranks on one host instead write their partials into a segment they all map and each sums them
all, in rank order, so every rank gets the same bits. Two buffers alternate, so a rank may
start the next sum while a slower one still reads the last; counters in the segment say who
has written (``ready``) and who has finished reading (``done``). Waits spin briefly, then
yield the core (ranks may outnumber cores), and give up after the group's timeout, or at once
when a rank's process is gone (``watch``: ranks that share a pid namespace).

The counters are 8-byte aligned stores and loads, which x86 keeps in program order with the
data around them; on other architectures the group uses gloo (``usable``).
"""

from __future__ import annotations

import contextlib
import mmap
import os
import platform
import secrets
import socket
import time

import numpy as np
import torch

# The store's way to map a segment by name: no resource tracker, the name checked, no link
# followed.
from kvstore_svc.shm import SHM_DIR, attach

SLOT_BYTES = 4 << 20  # a larger tensor goes through gloo (every rank decides the same)
# Spins before a wait yields its core: many while each rank has a core of its own, none when
# the ranks outnumber the cores (a spinning rank would take the core the late one needs).
SPINS_WITH_A_CORE_EACH = 2000


def usable() -> bool:
    return platform.machine() in ("x86_64", "AMD64")


def host_identity() -> str:
    """Ranks with the same identity share memory: the same machine and network namespace
    (a namespace stands for a host in the tests, so ranks in two of them talk over gloo)."""
    return f"{socket.gethostname()}/{os.stat('/proc/self/ns/net').st_ino}"


def pid_namespace() -> int:
    return os.stat("/proc/self/ns/pid").st_ino


class ShmAllReduce:
    """``size`` ranks' sums through one segment: rank 0 creates it (``name`` None), the
    others attach to the ``name`` it reports."""

    def __init__(self, rank: int, size: int, timeout_s: float, name: str | None = None):
        self.rank, self.size, self.timeout_s = rank, size, timeout_s
        cores = len(os.sched_getaffinity(0))
        self._spins = SPINS_WITH_A_CORE_EACH if size <= cores else 1
        header = 2 * size * 8
        self.nbytes = header + 2 * size * SLOT_BYTES
        create = name is None
        if name is None:
            name = f"fastserve-tp-{os.getpid()}-{secrets.token_hex(4)}"
            fd = os.open(SHM_DIR / name, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                         0o600)
            try:
                os.ftruncate(fd, self.nbytes)
                self._map = mmap.mmap(fd, self.nbytes)
            finally:
                os.close(fd)
        else:
            self._map = attach(name, self.nbytes)
        self.name, self._created = name, create
        buf = self._map
        counters = np.frombuffer(buf, np.int64, 2 * size)
        self.ready, self.done = counters[:size], counters[size:]
        if create:
            counters[:] = 0
        data = np.frombuffer(buf, np.uint8, 2 * size * SLOT_BYTES, offset=header)
        self._slots = torch.from_numpy(data).view(2, size, SLOT_BYTES)
        self._calls = 0
        self.peers: list[int] = []  # the other ranks' pids, when this process can see them

    def watch(self, pids: list[int]) -> None:
        """Check, while waiting, that the ranks ``pids`` (one pid namespace) still live: a dead
        one is noticed at once instead of after the whole timeout."""
        self.peers = [p for p in pids if p != os.getpid()]

    def fits(self, t: torch.Tensor) -> bool:
        return t.device.type == "cpu" and t.numel() * t.element_size() <= SLOT_BYTES

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum contiguous ``t`` over the ranks in place (the same bits on every rank)."""
        k = self._calls + 1
        buf = k % 2
        nbytes = t.numel() * t.element_size()
        # The buffer was last read in call k - 2: wait until everyone is done with it.
        self._wait(self.done, k - 2)
        slots = self._slots[buf, :, :nbytes].view(t.dtype).view(self.size, *t.shape)
        slots[self.rank].copy_(t)
        self.ready[self.rank] = k
        self._wait(self.ready, k)
        t.copy_(slots[0])
        for j in range(1, self.size):
            t.add_(slots[j])
        self.done[self.rank] = k
        self._calls = k
        return t

    def _wait(self, counters: np.ndarray, k: int) -> None:
        if k <= 0 or int(counters.min()) >= k:
            return
        start = time.monotonic()
        deadline, next_check = start + self.timeout_s, start + 0.05
        spins = 0
        while int(counters.min()) < k:
            spins += 1
            if spins >= self._spins:
                spins = 0
                os.sched_yield()
                now = time.monotonic()
                if now > deadline:
                    raise TimeoutError(f"a rank did not reach all-reduce {k} within "
                                       f"{self.timeout_s:g} s")
                if now > next_check:
                    next_check = now + 0.05
                    self._check_peers()

    def _check_peers(self) -> None:
        for pid in self.peers:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                raise TimeoutError(f"rank process {pid} is gone") from None
            except PermissionError:
                pass

    def unlink(self) -> None:
        """Rank 0, once every rank has attached: the name goes, the mappings stay."""
        if self._created:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(SHM_DIR / self.name)
