"""The runs of two ``sim_records.py`` outputs that differ, side by side: mean JCT, makespan,
swap-outs, recomputes and preemptions, before and after (for a change that is meant to move
figures, where the hashes alone only say that they moved).

    python docs/refactor-check/compare_records.py BEFORE_DIR AFTER_DIR
"""

from __future__ import annotations

import json
import pathlib
import sys


def _jct(data: dict) -> float:
    records = data["records"]  # (arrival, first token, finish, input, output) per request
    return sum(r[2] - r[0] for r in records) / len(records)


def main() -> None:
    before, after = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
    print(f"{'run':40s} {'JCT before':>10s} {'after':>8s} {'ratio':>6s} {'makespan':>9s} "
          f"{'after':>8s} {'swaps':>7s} {'after':>7s} {'recomp':>6s} {'after':>6s} "
          f"{'preempt':>8s} {'after':>8s}")
    for f in sorted(before.glob("*.json")):
        x, y = json.loads(f.read_text()), json.loads((after / f.name).read_text())
        if x == y:
            continue
        cx, cy = x["counters"], y["counters"]
        print(f"{f.stem:40s} {_jct(x):10.2f} {_jct(y):8.2f} {_jct(y) / _jct(x):6.3f} "
              f"{cx['sim_end_s']:9.1f} {cy['sim_end_s']:8.1f} {cx['num_swap_outs']:7d} "
              f"{cy['num_swap_outs']:7d} {cx['num_recomputes']:6d} {cy['num_recomputes']:6d} "
              f"{cx['num_preemptions']:8d} {cy['num_preemptions']:8d}")


if __name__ == "__main__":
    main()
