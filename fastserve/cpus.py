"""Which cores each process of a node may run on.

A CPU worker's PyTorch threads meet at a barrier after every operator, so one thread that
shares its core with another process (a client sending a large message, the scheduler
parsing it) holds up all of them: 40 ms of someone else's work cost a 2-core worker about
135 ms of compute (docs/benchmarks.md, issue 13). ``fastserve serve --reserve-cpus N`` keeps
the first N cores of this process's allowed set for the scheduler, the store and the HTTP
front end (and whatever else the machine runs), and gives each worker process a slice of the
rest of its own, with one PyTorch thread per core of it, as vLLM's CPU backend reserves a
core for its front end and binds its OpenMP threads.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass


def parse_cpu_list(text: str, field: str = "--cpus") -> tuple[int, ...]:
    """``"0-3,6"`` as ``(0, 1, 2, 3, 6)`` (sorted, each core once), the Linux cpulist format.

    Raises ValueError naming ``field`` when the text is not such a list (``bind_process``
    checks that the cores exist here).
    """
    cpus: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        try:
            first = int(lo)
            last = int(hi) if sep else first
        except ValueError:
            raise ValueError(f"{field}: {text!r} is not a list of cores such as 0-3,6") from None
        if first < 0 or last < first:
            raise ValueError(f"{field}: {part.strip()!r} is not a range of cores (low-high, "
                             f"low <= high, from 0)")
        cpus.update(range(first, last + 1))
    return tuple(sorted(cpus))


def format_cpu_list(cpus: tuple[int, ...] | list[int]) -> str:
    """The cpulist form of ``cpus``: consecutive cores as ranges, ``(0, 1, 2, 5)`` -> ``0-2,5``."""
    out: list[str] = []
    ordered = sorted(set(cpus))
    i = 0
    while i < len(ordered):
        j = i
        while j + 1 < len(ordered) and ordered[j + 1] == ordered[j] + 1:
            j += 1
        out.append(str(ordered[i]) if i == j else f"{ordered[i]}-{ordered[j]}")
        i = j + 1
    return ",".join(out)


def allowed_cpus() -> tuple[int, ...]:
    """The cores this process may run on (its affinity, within its container's cpuset)."""
    return tuple(sorted(os.sched_getaffinity(0)))


def bind_process(cpus: tuple[int, ...], field: str = "--cpus") -> None:
    """Run every thread of this process, and every thread and child it starts later, on
    ``cpus`` only.

    Raises ValueError naming ``field`` when some of them are not cores this process can run
    on (outside its container's cpuset, or not on this machine); nothing is bound then.
    """
    before = os.sched_getaffinity(0)
    try:
        os.sched_setaffinity(0, cpus)  # the kernel drops cores outside the cpuset...
        got = os.sched_getaffinity(0)
    except OSError:  # ...and refuses a set with none inside it
        got = set()
    if got != set(cpus):
        if got:
            os.sched_setaffinity(0, before)
        missing = sorted(set(cpus) - got)
        raise ValueError(f"{field}: core(s) {format_cpu_list(missing)} not available here "
                         f"(not on this machine, or outside its container's cpuset)")
    try:
        tasks = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:  # no procfs: the calling thread (and what it starts) only
        tasks = []
    for tid in tasks:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


@dataclass(frozen=True)
class CpuPlan:
    """Cores for a node's processes: ``reserved`` for everything but the workers, and one
    disjoint slice per worker process, in the order of their commands."""

    reserved: tuple[int, ...]
    workers: tuple[tuple[int, ...], ...]


def plan_cpus(allowed: tuple[int, ...], reserve: int, worker_processes: int) -> CpuPlan:
    """Keep the first ``reserve`` of ``allowed`` and split the rest into ``worker_processes``
    contiguous slices as even as they can be (the first ones one core larger).

    Raises ValueError naming ``--reserve-cpus`` when that leaves a worker process no core.
    """
    if reserve < 1:
        raise ValueError(f"--reserve-cpus must be at least 1 to plan cores, got {reserve}")
    rest = allowed[reserve:]
    if len(rest) < worker_processes:
        raise ValueError(
            f"--reserve-cpus {reserve}: this process may run on {len(allowed)} core(s) "
            f"({format_cpu_list(list(allowed))}), which leaves {len(rest)} for "
            f"{worker_processes} worker process(es); each needs at least one, so reserve at "
            f"most {len(allowed) - worker_processes}")
    base, extra = divmod(len(rest), worker_processes)
    slices, start = [], 0
    for i in range(worker_processes):
        size = base + (1 if i < extra else 0)
        slices.append(tuple(rest[start:start + size]))
        start += size
    return CpuPlan(tuple(allowed[:reserve]), tuple(slices))
