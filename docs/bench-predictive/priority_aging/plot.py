"""Plot of `sweep.py`'s runs: fixed-priority's tokens/s, mean and p95 JCT over FCFS's against
`priority_aging_s` (0 drawn at the left edge), for each trace and load, under `proactive`.

    python docs/bench-predictive/priority_aging/plot.py RUNS_DIR OUT.png
"""

from __future__ import annotations

import json
import pathlib
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

AGINGS = [0, 10, 30, 50, 100, 200, 300]
TRACES = {"sharegpt_lengths_llama2": "ShareGPT", "AzureLLMInferenceTrace_code": "code",
          "AzureLLMInferenceTrace_conv": "conversations"}
LOADS = {"0.85_cv4": "0.85x, CV 4", "1.5": "1.5x", "3": "3x"}


def main() -> None:
    runs, out = pathlib.Path(sys.argv[1]), sys.argv[2]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4.2))
    xs = [a if a else 3 for a in AGINGS]  # 0 at the left edge of the log axis
    for trace, tname in TRACES.items():
        for load, lname in LOADS.items():
            f = json.loads((runs / f"{trace}-{load}-proactive-fcfs.json").read_text())[0]
            rows = [json.loads((runs / f"{trace}-{load}-proactive-a{a:g}.json").read_text())[0]
                    for a in AGINGS]
            for ax, field in zip(axes, ("throughput_tokens_s", "mean_jct_s", "p95_jct_s")):
                ax.plot(xs, [r[field] / f[field] for r in rows], marker="o",
                        label=f"{tname}, {lname}")
    for ax, title in zip(axes, ("tokens/s / FCFS's", "mean JCT / FCFS's", "p95 JCT / FCFS's")):
        ax.set_xscale("log")
        ax.set_xticks(xs, ["0 (pure)", *[str(a) for a in AGINGS[1:]]])
        ax.axvline(100, color="grey", linestyle=":")
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xlabel("priority_aging_s (s per halving of the prompt)")
        ax.set_title(title)
    axes[0].axhline(0.95, color="red", linestyle="--", linewidth=0.8)
    axes[2].legend(fontsize=7)
    fig.suptitle("fixed-priority aged by arrival, 1,000 requests, OPT-13B/A100, proactive "
                 "(dotted: the default)")
    fig.tight_layout()
    fig.savefig(out, dpi=110)


if __name__ == "__main__":
    main()
