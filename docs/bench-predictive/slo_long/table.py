"""The table of slo_long/run.sh's searches: req/s at the SLO and / FCFS, the bound beside.

Usage: python docs/bench-predictive/slo_long/table.py FOLDER
"""

from __future__ import annotations

import json
import pathlib
import sys


def _cell(rate: float | None, fcfs: float, bound: float) -> str:
    """A rate at the SLO, starred above the bound, and its ratio to FCFS's."""
    if rate is None:
        return "-"
    return f"{rate:.3f}{'*' if rate > bound else ''} ({rate / fcfs:.2f}x)"


def main() -> None:
    folder = pathlib.Path(sys.argv[1])
    print("| trace, arrivals | bound | fcfs | oracle | sigma 0 | sigma 0.5 | sigma 0.75 |"
          " sigma 1 |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for trace in ("sharegpt", "azure"):
        for cv in (1, 4):
            base = folder / f"{trace}_cv{cv}_base.json"
            if not base.exists():
                continue
            rows = {r["policy"]: r for r in json.loads(base.read_text())}
            fcfs = rows["fcfs"]["rate_at_slo"]
            bound = rows["fcfs"]["sustainable_rate_bound"]
            cells = [_cell(rows["srpt-oracle"]["rate_at_slo"], fcfs, bound)]
            for sigma in ("0", "0.5", "0.75", "1"):
                path = folder / f"{trace}_cv{cv}_sigma{sigma}.json"
                cells.append(_cell(json.loads(path.read_text())[0]["rate_at_slo"], fcfs, bound)
                             if path.exists() else "")
            print(f"| {trace}, CV {cv} | {bound:.3f} | {fcfs:.3f} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
