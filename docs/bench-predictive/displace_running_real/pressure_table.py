"""The table of pressure.sh's runs (issue 12): each run's figures and their ratio to FCFS's.

Usage (from the repository root):
    python docs/bench-predictive/displace_running_real/pressure_table.py
"""

from __future__ import annotations

import json
import pathlib

OUT = pathlib.Path(__file__).parent / "pressure"


def main() -> None:
    base = json.loads((OUT / "fcfs" / "summaries.json").read_text())[0]
    print("| run | tok/s | JCT mean | / fcfs | p95 | TTFT mean | ms/token | / fcfs | swap-outs |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for run in sorted(p.name for p in OUT.iterdir() if (p / "summaries.json").exists()):
        s = json.loads((OUT / run / "summaries.json").read_text())[0]
        jct, lat = s["mean_jct_s"], s["mean_latency_per_token_s"]
        print(f"| {run} | {s['throughput_tokens_s']:.1f} | {jct:.2f} s | "
              f"{jct / base['mean_jct_s']:.2f}x | {s['p95_jct_s']:.2f} | {s['mean_ttft_s']:.2f} | "
              f"{lat * 1e3:.1f} | {lat / base['mean_latency_per_token_s']:.2f}x | "
              f"{s['num_swap_outs']:.0f} |")


if __name__ == "__main__":
    main()
