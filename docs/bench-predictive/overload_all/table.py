"""The markdown table of run.sh's runs: each policy + KV policy against FCFS at the same rate.

    python docs/bench-predictive/overload_all/table.py OUT_DIR
"""

from __future__ import annotations

import json
import pathlib
import sys

POLICIES = ("fcfs", "skip-join-mlfq", "mlfq", "fixed-priority", "predictive", "srpt-oracle")
KV_POLICIES = ("proactive", "reactive", "recompute", "defer")


def _order(run: dict) -> tuple[float, int, int]:
    policy, _, kv = run["policy"].partition("+")
    return (run["rate"], POLICIES.index(policy), KV_POLICIES.index(kv) if kv else -1)


def _kv(run: dict) -> str:
    return run["policy"].partition("+")[2]


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    runs = [json.loads(p.read_text())["summary"]
            for p in sorted(out.glob("*/*_rate*.json"))]
    # FCFS at the same rate, under the same KV policy where it ran under several.
    fcfs = {(r["rate"], _kv(r)): r for r in runs if r["policy"].startswith("fcfs")}
    for r in list(fcfs.values()):
        fcfs.setdefault((r["rate"], ""), r)
    print("| rate | policy + KV policy | tok/s | / fcfs | JCT mean s | / fcfs | p95 s "
          "| TTFT mean s | ms/token | swaps / request | recomputes / request |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in sorted(runs, key=_order):
        base = fcfs.get((r["rate"], _kv(r))) or fcfs[(r["rate"], "")]
        n = r["num_requests"]
        print(f"| {r['rate']} | {r['policy']} | {r['throughput_tokens_s']:.1f} "
              f"| {r['throughput_tokens_s'] / base['throughput_tokens_s']:.2f}x "
              f"| {r['mean_jct_s']:.2f} | {r['mean_jct_s'] / base['mean_jct_s']:.2f}x "
              f"| {r['p95_jct_s']:.1f} | {r['mean_ttft_s']:.2f} "
              f"| {1000 * r['mean_latency_per_token_s']:.1f} "
              f"| {(r.get('num_swap_outs') or 0) / n:.2f} "
              f"| {(r.get('num_recomputes') or 0) / n:.2f} |")


if __name__ == "__main__":
    main()
