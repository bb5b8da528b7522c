"""Runs of `bench compare` side by side with their run profiles (fastserve/bench/run_profile.py):
tokens/s, iterations, jobs per iteration, the worker's ms per decode-only iteration and per
job in it, ms per mixed iteration, the scheduler's ms outside compute, and the cores other
processes and the hypervisor took.

    python docs/bench-predictive/overload_all/profile_table.py DIR   # DIR/*/*_rate*.json
"""

from __future__ import annotations

import json
import pathlib
import sys


def row(path: pathlib.Path) -> str:
    s = json.loads(path.read_text())["summary"]
    p = s["run_profile"]
    dec = p["decode_compute_s"] / p["decode_iterations"]
    mixed = p["mixed_compute_s"] / max(1, p["mixed_iterations"])
    n = p["iterations"]
    return (f"| {path.parent.name} | {s['rate']} | {s['policy']} | "
            f"{s['throughput_tokens_s']:.1f} | "
            f"{s['makespan_s']:.1f} | {n:,} | {p['mean_batch']:.2f} | "
            f"{p['decode_iterations']:,} | {dec * 1e3:.1f} | {dec * 1e3 / p['mean_batch']:.2f} | "
            f"{p['mixed_iterations']:,} | {mixed * 1e3:.1f} | "
            f"{p['outside_compute_s'] / n * 1e3:.2f} | "
            f"{p['other_processes_cores']:.3f} | {p['steal_cores']:.3f} |")


def main(root: str) -> None:
    print("| run | rate | policy | tok/s | makespan s | iterations | jobs / iteration | decode "
          "iterations | ms each | ms / job | mixed iterations | ms each | outside ms | "
          "other cores | steal cores |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for path in sorted(pathlib.Path(root).glob("*/*_rate*.json")):
        print(row(path))


if __name__ == "__main__":
    main(sys.argv[1])
