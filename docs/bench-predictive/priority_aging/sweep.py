"""`fixed-priority` with its key aged by arrival (`priority_aging_s`), against FCFS, on the
three shared traces: tokens/s, mean and p95 JCT over FCFS's with the same KV policy, below
capacity (0.85x, Poisson and Gamma CV 4, the default `proactive`) and in overload (1.5x and 3x,
all four KV policies). The settings of the overload matrix (`overload_matrix/traces.sh`):
OPT-13B/A100, batch 16, 4,096 blocks, a 40,000-block store, 1,000 requests.

    python docs/bench-predictive/priority_aging/sweep.py OUT_DIR [AGING,...] [JOBS]

Writes one JSON per run into OUT_DIR (reused if there) and prints the table.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

# (trace, FCFS's capacity in req/s with the whole trace sent at once: the matrix's figures)
TRACES = [("sharegpt_lengths_llama2", 0.87), ("AzureLLMInferenceTrace_code", 2.6),
          ("AzureLLMInferenceTrace_conv", 1.8)]
KVS = ("proactive", "reactive", "recompute", "defer")
# (label, load, arrival flags, KV policies)
LOADS = [("0.85", 0.85, (), ("proactive",)),
         ("0.85 cv4", 0.85, ("--arrivals", "gamma", "--cv", "4"), ("proactive",)),
         ("1.5", 1.5, (), KVS), ("3", 3.0, (), KVS)]


def run(out: pathlib.Path, trace: str, cap: float, label: str, load: float, flags: tuple[str, ...],
        kv: str, aging: float | None) -> dict:
    name = f"{trace}-{label.replace(' ', '_')}-{kv}-" + ("fcfs" if aging is None else f"a{aging:g}")
    path = out / f"{name}.json"
    if not path.exists():
        policy = ["--policies", "fcfs"] if aging is None else [
            "--policies", "fixed-priority", "--priority-aging", str(aging)]
        subprocess.run(["fastserve", "sim", "--trace", f"../shared/traces/{trace}.csv",
                        *policy, "--kv-policies", kv, "--store-blocks", "40000",
                        "--num-requests", "1000", "--max-batch-size", "16",
                        "--rate", f"{cap * load:.4g}", *flags, "--json", str(path)],
                       check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    return json.loads(path.read_text())[0]


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    spec = sys.argv[2] if len(sys.argv) > 2 else "0,10,30,50,100,200,300"
    agings = [float(a) for a in spec.split(",")]
    jobs = int(sys.argv[3]) if len(sys.argv) > 3 else 2
    cases = [(t, c, lab, ld, fl, kv, a) for t, c in TRACES for lab, ld, fl, kvs in LOADS
             for kv in kvs for a in [None, *agings]]
    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(lambda case: run(out, *case), cases))
    by = dict(zip(cases, results))
    print("fixed-priority / FCFS: tokens/s / mean JCT / p95 JCT, by priority_aging_s "
          "(* under 0.95x FCFS's tokens/s)")
    print(f"{'trace':28s} {'load':8s} {'kv':10s}" + "".join(f"{a:>21g}" for a in agings))
    for t, c in TRACES:
        for lab, ld, fl, kvs in LOADS:
            for kv in kvs:
                f = by[(t, c, lab, ld, fl, kv, None)]
                cells = []
                for a in agings:
                    r = by[(t, c, lab, ld, fl, kv, a)]
                    tok = r["throughput_tokens_s"] / f["throughput_tokens_s"]
                    jct = r["mean_jct_s"] / f["mean_jct_s"]
                    p95 = r["p95_jct_s"] / f["p95_jct_s"]
                    cells.append(f"{tok:.3f}{'*' if tok < 0.95 else ' '}/{jct:.3f}/{p95:.2f}")
                print(f"{t:28s} {lab:8s} {kv:10s}" + "".join(f"{x:>21s}" for x in cells))


if __name__ == "__main__":
    main()
