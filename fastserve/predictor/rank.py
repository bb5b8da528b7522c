"""Spearman's rank correlation (ties get their average rank), with numpy only."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def ranks(x: Sequence[float] | np.ndarray) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    order = np.argsort(a, kind="stable")
    sorted_a = a[order]
    # Each run of equal values shares the mean of the positions it spans.
    starts = np.r_[0, np.flatnonzero(np.diff(sorted_a)) + 1]
    ends = np.r_[starts[1:], len(a)]
    avg = np.repeat((starts + ends - 1) / 2.0, ends - starts)
    out = np.empty(len(a))
    out[order] = avg
    return out


def spearman(a: Sequence[float] | np.ndarray, b: Sequence[float] | np.ndarray) -> float:
    """NaN with fewer than two values or when either side is constant."""
    if len(a) < 2:
        return float("nan")
    ra, rb = ranks(a), ranks(b)
    ra, rb = ra - ra.mean(), rb - rb.mean()
    denom = float(np.linalg.norm(ra) * np.linalg.norm(rb))
    return float(ra @ rb / denom) if denom > 0 else float("nan")
