"""Plot docs/bench-predictive/slo/*.json (fastserve sim --slo-search --json): mean latency per
token against the arrival rate, per trace and burstiness, fcfs / predictive at each prediction
sigma / srpt-oracle, with the SLO line. Writes docs/bench-predictive/slo.png."""

import json
import pathlib

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

HERE = pathlib.Path(__file__).parent
RUNS = [("s0", "sigma 0"), ("s0.5", "sigma 0.5"), ("s0.75", "sigma 0.75 (the real predictor's)"),
        ("s1", "sigma 1"), ("s0.75_starve60", "sigma 0.75, starve limit 60 s")]


def curve(summary):
    points = [p for p in summary["slo_curve"] if not p["lower_bound"]]
    points.sort(key=lambda p: p["rate"])
    return [p["rate"] for p in points], [1000 * p["mean_latency_per_token_s"] for p in points]


fig, axes = plt.subplots(2, 2, figsize=(12, 9))
for ax, (trace, cv) in zip(axes.flat, [(t, c) for t in ("sharegpt", "azure") for c in (1, 4)]):
    slo = None
    for suffix, label in RUNS:
        path = HERE / "slo" / f"{trace}_cv{cv}_{suffix}.json"
        for s in json.loads(path.read_text()):
            slo = s["slo_s_per_token"] * 1000
            name = s["policy"] if s["policy"] != "predictive" else f"predictive, {label}"
            style = {"fcfs": "k-", "srpt-oracle": "r--"}.get(s["policy"], "-")
            x, y = curve(s)
            ax.plot(x, y, style, marker=".", label=f"{name}: {s['rate_at_slo']:.2f} req/s")
    ax.axhline(slo, color="grey", lw=0.8)
    ax.set_ylim(0, 2.5 * slo)
    ax.set_title(f"{trace}, Gamma CV {cv}")
    ax.set_xlabel("arrival rate (req/s)")
    ax.set_ylabel("mean latency per token (ms)")
    ax.legend(fontsize=7)
    ax.grid(alpha=0.3)
fig.suptitle("Throughput at the SLO (grey), OPT-13B/A100 cost model, 1,000 requests")
fig.tight_layout()
fig.savefig(HERE / "slo.png", dpi=90)
print(HERE / "slo.png")
