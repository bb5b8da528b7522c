"""Where a benchmark run's time went, beside what its client saw.

Two runs of the same requests under one policy can differ in tokens/s by a third on a shared
machine (docs/benchmarks.md). Either the batches differed (the policy's choices depend on
where arrivals fall between iterations) or the same batches took longer (the machine). A
``RunProfile`` taken around one replay tells which: the scheduler's iterations by kind with
the worker's compute for each, the mean batch, the time outside compute (planning, wire), the
CPU seconds of each process, and the cores that other work took over the run, split into
other processes and the hypervisor's steal.
"""

from __future__ import annotations

import os
import pathlib
import time
import urllib.request
from collections.abc import Sequence
from typing import Any

from fastserve.cpu_load import cpu_times
from fastserve.cpus import allowed_cpus

# The scheduler's iteration kinds (scheduler_svc/metrics.py): prompt tokens only, prompt
# chunks beside decodes, one token per job, and no job computed (frees and swaps only).
KINDS = ("prefill", "mixed", "decode", "other")


class RunProfile:
    """Started when made, around one replay; ``finish()`` gives the figures since then.

    ``metrics_port`` is the scheduler's Prometheus port (0 or less: no iteration figures);
    ``procs`` names the cluster's processes (objects with a ``pid``; None is skipped)."""

    def __init__(self, metrics_port: int, procs: dict[str, Any]):
        self.port, self.procs = metrics_port, procs
        self.cpus = set(allowed_cpus())
        self._metrics = scrape(metrics_port) if metrics_port > 0 else {}
        self._cpu = cpu_seconds(procs)
        self._times = cpu_times(self.cpus)
        self._wall = time.perf_counter()

    def finish(self) -> dict[str, Any]:
        span = time.perf_counter() - self._wall
        row: dict[str, Any] = {"span_s": span}
        if self.port > 0:
            after = scrape(self.port)
            row.update(iteration_figures({k: v - self._metrics.get(k, 0.0)
                                          for k, v in after.items()}))
        cpu = cpu_seconds(self.procs)
        for name, seconds in cpu.items():
            row[f"cpu_{name}_s"] = seconds - self._cpu.get(name, 0.0)
        own = sum(row[f"cpu_{name}_s"] for name in cpu)
        times = cpu_times(self.cpus)
        if times is not None and self._times is not None and span > 0:
            busy, steal = times[0] - self._times[0], times[1] - self._times[1]
            # Cores, averaged over the run, that went to neither this cluster nor its client.
            row["other_processes_cores"] = max(0.0, busy - steal - own) / span
            row["steal_cores"] = steal / span
        row["cores"] = len(self.cpus)
        return row


def iteration_figures(d: dict[str, float]) -> dict[str, Any]:
    """Iterations and worker compute by kind, the mean batch (jobs per iteration that computed
    any) and the time outside compute, from the differences of the scheduler's counters over a
    run (``scrape``'s keys)."""
    row: dict[str, Any] = {}
    compute = 0.0
    for kind in KINDS:
        row[f"{kind}_iterations"] = int(d.get(f'fastserve:iteration_kind_total{{kind="{kind}"}}',
                                              0.0))
        t = d.get(f'fastserve:iteration_kind_compute_seconds_total{{kind="{kind}"}}', 0.0)
        row[f"{kind}_compute_s"] = t
        compute += t
    n = d.get("fastserve:iteration_overhead_seconds_count", 0.0)
    row["iterations"] = int(n)
    row["compute_s"] = d.get("fastserve:iteration_time_seconds_sum", compute)
    row["outside_compute_s"] = d.get("fastserve:iteration_overhead_seconds_sum", 0.0)
    # Jobs per iteration that computed any (the "other" kind computes none).
    computing = row["iterations"] - row["other_iterations"]
    jobs = d.get("fastserve:iteration_batch_size_sum", 0.0)
    row["mean_batch"] = jobs / computing if computing > 0 else None
    return row


def scrape(port: int) -> dict[str, float]:
    """Every counter and histogram sum/count of the scheduler, keyed ``name{labels}``."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read()
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(text.decode()):
        for s in fam.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(s.labels.items()))
            out[s.name + (f"{{{labels}}}" if labels else "")] = s.value
    return out


def cpu_seconds(procs: dict[str, Any]) -> dict[str, float]:
    """User + system CPU seconds of each live process and of this one (the client)."""
    tick = os.sysconf("SC_CLK_TCK")
    out = {"client": sum(os.times()[:2])}
    for name, p in procs.items():
        if p is None:
            continue
        try:
            fields = pathlib.Path(f"/proc/{p.pid}/stat").read_text().rsplit(")", 1)[1].split()
            out[name] = (int(fields[11]) + int(fields[12])) / tick
        except (OSError, IndexError, ValueError):
            pass
    return out


def format_profiles(summaries: Sequence[dict[str, Any]]) -> str:
    """One row per run that has a profile: iterations, the mean batch, the worker's ms per
    iteration of each kind that computed jobs, the scheduler's ms per iteration outside
    compute, and the cores other processes and the hypervisor took, averaged over the run.
    Empty where no run has one (peers only)."""
    from fastserve.bench.serve import _fmt, run_label

    profiled = [(s, p) for s in summaries if (p := s.get("run_profile")) and "iterations" in p]
    if not profiled:
        return ""
    head = (f"{'policy':<26} {'rate':>6} {'iterations':>10} {'batch':>6} | "
            f"{'decode ms':>9} {'mixed ms':>9} {'prefill ms':>10} {'outside ms':>10} | "
            f"{'other cores':>11} {'steal':>6}")
    lines = [head, "-" * len(head)]
    for s, p in profiled:
        n = p["iterations"]
        lines.append(
            f"{run_label(s):<26} {_fmt(s['rate']):>6} {n:>10} {_fmt(p['mean_batch']):>6} | "
            f"{_fmt(_per_iteration(p, 'decode'), 1e3, 1):>9} "
            f"{_fmt(_per_iteration(p, 'mixed'), 1e3, 1):>9} "
            f"{_fmt(_per_iteration(p, 'prefill'), 1e3, 1):>10} "
            f"{_fmt(p['outside_compute_s'] / n if n else None, 1e3, 2):>10} | "
            f"{_fmt(p.get('other_processes_cores')):>11} {_fmt(p.get('steal_cores')):>6}")
    lines.append("ms = the worker's compute per iteration of that kind (outside: the "
                 "scheduler's planning and the wire); cores other work took, averaged over "
                 f"the run, of {profiled[-1][1]['cores']}")
    return "\n".join(lines)


def _per_iteration(p: dict[str, Any], kind: str) -> float | None:
    """The worker's compute per iteration of ``kind`` in profile ``p``, or None if none ran."""
    n = p[f"{kind}_iterations"]
    return p[f"{kind}_compute_s"] / n if n else None
