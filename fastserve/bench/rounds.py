"""Ratios against a reference run taken beside each run, for `bench compare --rounds`.

On a shared machine the same run can be a third faster or slower from one quarter of an hour
to the next (docs/benchmarks.md, "Each run's profile"), so one reference run at the start of a
comparison is a poor yardstick for a run made twenty minutes later. With ``--rounds N`` the
runs are made N times in turn and the reference (the first policy listed) once more at the
end, so every other run lies between two reference runs; each is measured against the
reference's figure at its own time, interpolated linearly between the reference runs around
it (the nearest one outside them). Reported per policy: the ratio in each round, the worst
(lowest tokens/s, highest JCT) and the geometric mean.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import numpy as np

# Figures compared: the summary key, the column's name, and whether higher is better.
FIGURES = (("throughput_tokens_s", "tok/s", True), ("mean_jct_s", "JCT mean", False))


def schedule(policies: list[str], kv_policies: list[str | None], rounds: int
             ) -> list[tuple[int | None, str, str | None]]:
    """The runs at one rate, in order: (round, policy, KV policy); the round is None without
    --rounds. With rounds, the first run is made once more after the last round."""
    pairs = [(p, k) for p in policies for k in kv_policies]
    if rounds == 1:
        return [(None, p, k) for p, k in pairs]
    runs = [(r, p, k) for r in range(1, rounds + 1) for p, k in pairs]
    return [*runs, (rounds + 1, *pairs[0])] if pairs else runs


def at_time(points: Sequence[tuple[float, float]], t: float) -> float:
    """The value at ``t`` of the piecewise-linear curve through ``points`` (time, value),
    constant beyond its ends."""
    if not points:
        raise ValueError("no reference runs")
    xs, ys = zip(*sorted(points))
    return float(np.interp(t, xs, ys))


def _mid(s: dict[str, Any]) -> float:
    return s["started_at"] + s["wall_s"] / 2


def bracketed(summaries: Sequence[dict[str, Any]], reference: str) -> list[dict[str, Any]]:
    """For each run of another policy than ``reference`` (a summary's ``policy``), at each
    rate: its figures over the reference's interpolated at the run's midpoint. Runs need
    ``started_at`` (epoch s) and ``wall_s``. One row per (policy, rate): ``ratios`` maps each
    figure to the list of ratios in round order."""
    rows: dict[tuple[str, Any], dict[str, Any]] = {}
    refs = [s for s in summaries if s["policy"] == reference]
    for s in summaries:
        if s["policy"] == reference:
            continue
        same_rate = [r for r in refs if r["rate"] == s["rate"]]
        row = rows.setdefault((s["policy"], s["rate"]), {
            "policy": s["policy"], "rate": s["rate"], "reference": reference,
            "num_reference_runs": len(same_rate), "ratios": {k: [] for k, _, _ in FIGURES}})
        for key, _, _ in FIGURES:
            points = [(_mid(r), r[key]) for r in same_rate if r.get(key)]
            value = s.get(key)
            row["ratios"][key].append(value / at_time(points, _mid(s))
                                      if points and value else None)
    return list(rows.values())


def format_bracketed(rows: Sequence[dict[str, Any]]) -> str:
    """The table `bench compare --rounds` prints: per policy and rate, each figure's ratio in
    every round, then the worst and the geometric mean (worst: lowest for tokens/s, highest
    for JCT)."""
    if not rows:
        return ""
    reference = rows[0]["reference"]
    head = f"{'policy':<26} {'rate':>6} | " + " | ".join(
        f"{name + ' / ' + reference + ' by round':<34} {'worst':>6} {'geo':>6}"
        for _, name, _ in FIGURES)
    lines = [f"against {reference}'s runs before and after each (interpolated in time):",
             head, "-" * len(head)]
    for row in rows:
        cells = []
        for key, _, higher_better in FIGURES:
            got = [r for r in row["ratios"][key] if r is not None]
            by_round = " ".join(f"{r:.2f}" if r is not None else "-"
                                for r in row["ratios"][key])
            worst = (min(got) if higher_better else max(got)) if got else None
            geo = statistics.geometric_mean(got) if got else None
            cells.append(f"{by_round:<34} {_x(worst):>6} {_x(geo):>6}")
        rate = "trace" if row["rate"] is None else f"{row['rate']:g}"
        lines.append(f"{row['policy']:<26} {rate:>6} | " + " | ".join(cells))
    return "\n".join(lines)


def _x(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"
