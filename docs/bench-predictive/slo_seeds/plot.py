"""Throughput at the SLO by arrival seed and trace length, each policy's bar beside the rate no
policy could sustain on those requests (the JSON files of run.sh).

Usage (repository root): python docs/bench-predictive/slo_seeds/plot.py OUT.png
"""

from __future__ import annotations

import json
import pathlib
import re
import sys

HERE = pathlib.Path(__file__).parent
NAME = re.compile(r"(?P<trace>\w+?)_cv4_store40000_sigma0\.75(?:_n(?P<n>\d+))?_seed(?P<seed>\d)")
COLOURS = {"fcfs": "tab:gray", "predictive": "tab:blue", "srpt-oracle": "tab:green"}


def main() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    runs: dict[str, dict[tuple[int, int], list[dict]]] = {}
    for path in sorted(HERE.glob("*.json")):
        m = NAME.fullmatch(path.stem)
        if m is None:
            continue
        key = (int(m["n"] or 1000), int(m["seed"]))
        runs.setdefault(m["trace"], {})[key] = json.loads(path.read_text())
    fig, axes = plt.subplots(1, len(runs), figsize=(6.5 * len(runs), 4.2), squeeze=False)
    for ax, (trace, by_run) in zip(axes[0], sorted(runs.items())):
        keys = sorted(by_run)
        for i, key in enumerate(keys):
            rows = by_run[key]
            width = 0.8 / len(rows)
            for j, row in enumerate(rows):
                rate = row["rate_at_slo"] or 0.0
                ax.bar(i + (j - (len(rows) - 1) / 2) * width, rate, width,
                       color=COLOURS.get(row["policy"], "k"),
                       label=row["policy"] if i == 0 else None)
            bound = rows[0]["sustainable_rate_bound"]
            ax.hlines(bound, i - 0.45, i + 0.45, colors="tab:red",
                      label="no policy sustains more" if i == 0 else None)
        ax.set_xticks(range(len(keys)), [f"{n} req\nseed {s}" for n, s in keys])
        ax.set_ylabel("req/s at the SLO (mean latency per token <= 240 ms)")
        ax.set_title(f"{trace}, Gamma CV 4, sigma 0.75, 40,000-block store")
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(sys.argv[1], dpi=110)


if __name__ == "__main__":
    main()
