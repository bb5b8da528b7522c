"""Tokens/s of every policy and KV policy against FCFS's with the same KV policy, from the
JSON summaries `traces.sh` writes; a star marks a pair under 0.95x.

    python docs/bench-predictive/overload_matrix/table.py DIR
"""

from __future__ import annotations

import json
import pathlib
import sys


def main() -> None:
    for path in sorted(pathlib.Path(sys.argv[1]).glob("*.json")):
        runs = {(r["policy"], r["kv_policy"]): r for r in json.loads(path.read_text())}
        kvs = sorted({kv for _, kv in runs})
        n = next(iter(runs.values()))["num_requests"]
        print(f"{path.stem}: tok/s / fcfs's (recomputes, swap-outs per request)")
        print(f"  {'':16s}" + "".join(f"{kv:>22s}" for kv in kvs))
        for policy in dict.fromkeys(p for p, _ in runs):
            if policy == "fcfs":
                continue
            cells = []
            for kv in kvs:
                r = runs[(policy, kv)]
                ratio = r["throughput_tokens_s"] / runs[("fcfs", kv)]["throughput_tokens_s"]
                cells.append(f"{ratio:.3f}{'*' if ratio < 0.95 else ' '} "
                             f"({r['num_recomputes'] / n:.2f}, {r['num_swap_outs'] / n:.1f})")
            print(f"  {policy:16s}" + "".join(f"{c:>22s}" for c in cells))


if __name__ == "__main__":
    main()
