"""How much of this process's cores went to other work over a span of time.

A measurement that decides something for good (the linear kernels' plan, cached per machine)
must not be taken while another process shares the cores: the native decode kernel's threads
meet at a barrier, so a core taken away slows it several times more than it slows sgemm, and
a plan timed beside other work, with no tiled kernel, kept the default model's decodes at
2-2.5x their time on a quiet machine (docs/benchmarks.md, "A linear plan timed beside other
work").
Linux's ``/proc/stat`` counts every core's busy time, ``time.process_time`` this process's
own: the difference, over the cores this process may run on, is everyone else's (the
hypervisor's steal included).
"""

from __future__ import annotations

import os
import pathlib
import time

from fastserve.cpus import allowed_cpus

STAT = pathlib.Path("/proc/stat")


def busy_seconds(cpus: set[int], stat: pathlib.Path = STAT) -> float | None:
    """Seconds ``cpus`` have been busy since boot (all but idle and I/O wait; steal counts as
    busy), or None where the counters cannot be read (not Linux)."""
    times = cpu_times(cpus, stat)
    return None if times is None else times[0]


def cpu_times(cpus: set[int], stat: pathlib.Path = STAT) -> tuple[float, float] | None:
    """Busy seconds of ``cpus`` since boot (as ``busy_seconds``) and, of those, steal: the
    hypervisor ran something else while they had work. None where the counters cannot be read
    (not Linux, or none of ``cpus`` listed)."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    busy, steal, found = 0, 0, 0
    for line in lines:
        name, _, rest = line.partition(" ")
        if not name.startswith("cpu") or name == "cpu" or not name[3:].isdigit():
            continue
        if int(name[3:]) not in cpus:
            continue
        # user nice system idle iowait irq softirq steal [guest guest_nice] (guest time is
        # also counted in user, so only the first eight add up)
        values = [int(v) for v in rest.split()[:8]]
        busy += sum(values) - values[3] - values[4]
        steal += values[7]
        found += 1
    if not found:
        return None
    hz = os.sysconf("SC_CLK_TCK")
    return busy / hz, steal / hz


class OtherWork:
    """Started when made: ``share()`` is the fraction of this process's cores' time since
    then that went to other processes (0 to 1), or None where it cannot be measured."""

    def __init__(self) -> None:
        self.cpus = set(allowed_cpus())
        self._wall = time.monotonic()
        self._own = time.process_time()
        self._busy = busy_seconds(self.cpus)

    def share(self) -> float | None:
        busy = busy_seconds(self.cpus)
        wall = time.monotonic() - self._wall
        if busy is None or self._busy is None or wall <= 0:
            return None
        others = (busy - self._busy) - (time.process_time() - self._own)
        return max(0.0, min(1.0, others / (wall * len(self.cpus))))
