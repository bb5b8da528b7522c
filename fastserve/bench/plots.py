"""Figures of `fastserve bench compare` (PNG, matplotlib's Agg backend, no display needed)."""

from __future__ import annotations

import pathlib
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np


def _pyplot():  # type: ignore[no-untyped-def]
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _plain_log_ticks(axis) -> None:  # type: ignore[no-untyped-def]
    """Log-scale ticks as plain numbers (0.02, not 2x10^-2), minor ones unlabelled."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(NullFormatter())


def _rate_label(rate: float | None) -> str:
    return "trace rate" if rate is None else f"{rate:g} req/s"


def plot_jct_cdf(jcts: Mapping[float | None, Mapping[str, Sequence[float]]],
                 path: str | pathlib.Path, title: str = "") -> pathlib.Path:
    """The JCT CDF of each policy, one panel per rate: ``jcts[rate][policy]`` = JCTs (s)."""
    plt = _pyplot()
    rates = list(jcts)
    fig, axes = plt.subplots(1, len(rates), figsize=(5.5 * len(rates), 4.2), squeeze=False)
    for ax, rate in zip(axes[0], rates):
        for policy, values in jcts[rate].items():
            v = np.sort(np.asarray(values, dtype=np.float64))
            if len(v):
                ax.step(v, np.arange(1, len(v) + 1) / len(v), where="post", label=policy)
        ax.set_xscale("log")
        _plain_log_ticks(ax.xaxis)
        ax.set_xlabel("job completion time (s)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.01)
        ax.set_title(f"JCT CDF, {_rate_label(rate)}")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(loc="lower right")
    return _save(plt, fig, path, title)


def plot_latency_vs_rate(summaries: Sequence[Mapping[str, Any]], path: str | pathlib.Path,
                         title: str = "") -> pathlib.Path:
    """Mean and p95 latency per output token against the arrival rate, a line per policy."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    policies = list(dict.fromkeys(s["policy"] for s in summaries))
    for ax, key, name in ((axes[0], "mean_latency_per_token_s", "mean"),
                          (axes[1], "p95_latency_per_token_s", "p95")):
        for policy in policies:
            pts = sorted((s["rate"], s[key]) for s in summaries
                         if s["policy"] == policy and s["rate"] is not None
                         and s.get(key) is not None)
            if pts:
                x, y = zip(*pts)
                ax.plot(x, np.asarray(y) * 1e3, marker="o", label=policy)
        ax.set_xlabel("arrival rate (requests/s)")
        ax.set_ylabel(f"{name} latency per output token (ms)")
        ax.set_yscale("log")
        _plain_log_ticks(ax.yaxis)
        ax.set_title(f"{name} latency per token")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    return _save(plt, fig, path, title)


def _save(plt: Any, fig: Any, path: str | pathlib.Path, title: str) -> pathlib.Path:
    """Title, lay out, write the PNG and free the figure."""
    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    path = pathlib.Path(path)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path
