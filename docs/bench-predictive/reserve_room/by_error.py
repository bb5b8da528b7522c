"""Where `predictive`'s mean latency per token goes against the oracle's, by prompt size and
prediction error (docs/benchmarks.md, "Room held for the first new job that waits").

Azure conversations (or TRACE), 1,000 requests, Gamma CV 4 at RATE, OPT-13B/A100, no store,
`predictive` at sigma 0.75 with worker-timed predictions (refresh 16) beside `srpt-oracle`, over
SEEDS arrival seeds; each job's share of the mean latency per token and its wait for a first
token, grouped by its prompt (over 2,000 tokens or not) and by predicted / true length. Extra
KEY=VALUE arguments are scheduler settings for both runs (`reserve_mode=1` with sim.patch),
and `store=N` a store of N blocks.

Usage (from the repository root, the patched tree made by run.sh first on the path):
    PYTHONPATH=/tmp/fastserve-reserve-room python docs/bench-predictive/reserve_room/by_error.py \
        ../shared/traces/AzureLLMInferenceTrace_conv.csv 3.0 4 reserve_mode=1
"""

from __future__ import annotations

import collections
import math
import random
import sys

from fastserve.traces import load_trace
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import PUBLISHED
from scheduler_svc.sim import simulate

EDGES = (0.0, 0.5, 0.8, 1.25, 2.0, math.inf)


def main() -> None:
    trace, rate, seeds = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    settings = {k: (int(v) if v.isdigit() else float(v))
                for k, v in (a.split("=") for a in sys.argv[4:])}
    store = int(settings.pop("store", 0))
    cost = PUBLISHED["opt-13b-a100"]
    groups: dict[tuple[str, float], list[float]] = collections.defaultdict(lambda: [0.0] * 5)
    total = 0
    for seed in range(seeds):
        reqs = load_trace(trace, rate=rate, arrivals="gamma", cv=4.0, num_requests=1000,
                          seed=seed)
        noise = random.Random(seed)  # the simulator's draws of predicted / true
        ratio = [math.exp(noise.gauss(0.0, 0.75)) for _ in reqs]
        pred = simulate(reqs, config=SchedulerConfig(policy="predictive", **settings),
                        cost_model=cost, num_blocks=4096, rate=rate, prediction_sigma=0.75,
                        prediction_seed=seed, prediction_refresh=16, store_blocks=store)
        oracle = simulate(reqs, config=SchedulerConfig(policy="srpt-oracle", **settings),
                          cost_model=cost, num_blocks=4096, rate=rate, store_blocks=store)
        total += len(reqs)
        for i, (x, y) in enumerate(zip(pred.records, oracle.records)):
            assert x is not None and y is not None
            band = max(e for e in EDGES if e <= ratio[i])
            g = groups[("long prompt" if x.input_tokens > 2000 else "short prompt", band)]
            g[0] += 1
            g[1] += x.jct_s / x.output_tokens
            g[2] += y.jct_s / y.output_tokens
            g[3] += x.first_token_s - x.arrival_s
            g[4] += y.first_token_s - y.arrival_s
    print("prompt        predicted/true >=  jobs | ms/token share: predictive  oracle | "
          "first-token wait s: predictive  oracle")
    for (kind, band), g in sorted(groups.items()):
        print(f"{kind:13s} {band:17.2f} {int(g[0]):5d} | {g[1] / total * 1e3:24.1f} "
              f"{g[2] / total * 1e3:7.1f} | {g[3] / g[0]:29.2f} {g[4] / g[0]:7.2f}")
    mean = [sum(g[k] for g in groups.values()) / total * 1e3 for k in (1, 2)]
    print(f"mean latency per token, ms: predictive {mean[0]:.1f}, oracle {mean[1]:.1f}")


if __name__ == "__main__":
    main()
