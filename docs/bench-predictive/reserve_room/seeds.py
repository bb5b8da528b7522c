"""Mean latency per token (or another summary figure) over several arrival seeds, by scheduler
settings (issue 12).

The SLO search runs one arrival seed, and near the knee one seed's figure moves by a grid
step with any change in order; this runs 1,000 requests of TRACE at each of RATES (Gamma CV 4,
OPT-13B/A100, 4,096 blocks) for seeds 0..SEEDS-1 and prints, per variant, the mean over seeds
and each seed's figure. A variant is `;`-separated KEY=VALUE scheduler settings, plus
`policy=` (default predictive; sigma 0.75 with worker-timed predictions) and `store=` (blocks).
A first argument `--metric NAME` prints that figure of `SimResult.summary()` instead (seconds
are printed as they are; the default, mean_latency_per_token_s, in ms).

Usage (from the repository root; with the patched tree of run.sh first on the path for
`reserve_mode` and, with rs_rank.patch on it too, `rank_power`):
    PYTHONPATH=/tmp/fastserve-reserve-room python docs/bench-predictive/reserve_room/seeds.py \
        ../shared/traces/AzureLLMInferenceTrace_conv.csv 2.5,3,3.5 4 "" "reserve_mode=1"
"""

from __future__ import annotations

import statistics
import sys

from fastserve.traces import load_trace
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import PUBLISHED
from scheduler_svc.sim import simulate


def value(text: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def main() -> None:
    argv = sys.argv[1:]
    metric, scale = "mean_latency_per_token_s", 1e3
    if argv[0] == "--metric":
        metric, scale, argv = argv[1], 1.0, argv[2:]
    trace, seeds = argv[0], int(argv[2])
    rates = [float(r) for r in argv[1].split(",")]
    cost = PUBLISHED["opt-13b-a100"]
    for variant in argv[3:]:
        settings = {k: value(v) for k, v in (kv.split("=") for kv in variant.split(";") if kv)}
        policy = str(settings.pop("policy", "predictive"))
        store = int(settings.pop("store", 0))
        cells = []
        for rate in rates:
            figures = []
            for seed in range(seeds):
                reqs = load_trace(trace, rate=rate, arrivals="gamma", cv=4.0,
                                  num_requests=1000, seed=seed)
                predictions = ({"prediction_sigma": 0.75, "prediction_seed": seed,
                                "prediction_refresh": 16} if policy == "predictive" else {})
                result = simulate(reqs, config=SchedulerConfig(policy=policy, **settings),
                                  cost_model=cost, num_blocks=4096, rate=rate,
                                  store_blocks=store, **predictions)
                figures.append(result.summary()[metric] * scale)
            each = " ".join(f"{f:.0f}" for f in figures)
            cells.append(f"{rate}: {statistics.mean(figures):6.1f} ({each})")
        print(policy, settings, f"store={store}", " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
