"""`fixed-priority` pure (aging 0) and aged (the default, 100 s) against FCFS on longer ShareGPT
runs and arrival seeds the sweep did not use: tokens/s, mean and p95 JCT over FCFS's.

    python docs/bench-predictive/priority_aging/longer.py OUT_DIR
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

# (requests, rate in req/s: 1.5x and 3x FCFS's capacity, arrival seed)
RUNS = [(4000, 1.3, 1), (4000, 2.6, 2), (2000, 1.3, 3), (2000, 2.6, 4)]


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    for n, rate, seed in RUNS:
        for aging in (0, 100):
            path = out / f"sharegpt-{n}-{rate}-s{seed}-a{aging}.json"
            if not path.exists():
                subprocess.run(["fastserve", "sim", "--trace",
                                "../shared/traces/sharegpt_lengths_llama2.csv",
                                "--policies", "fcfs,fixed-priority", "--kv-policies",
                                "defer,proactive", "--store-blocks", "40000", "--num-requests",
                                str(n), "--max-batch-size", "16", "--rate", str(rate),
                                "--seed", str(seed), "--priority-aging", str(aging),
                                "--json", str(path)],
                               check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            runs = {(r["policy"], r["kv_policy"]): r for r in json.loads(path.read_text())}
            for kv in ("defer", "proactive"):
                f, p = runs[("fcfs", kv)], runs[("fixed-priority", kv)]
                print(f"{n} requests at {rate} req/s, seed {seed}, aging {aging:>3d} s, {kv:9s}: "
                      f"tok/s {p['throughput_tokens_s'] / f['throughput_tokens_s']:.3f}  "
                      f"JCT mean {p['mean_jct_s'] / f['mean_jct_s']:.3f}  "
                      f"p95 {p['p95_jct_s'] / f['p95_jct_s']:.3f}")


if __name__ == "__main__":
    main()
