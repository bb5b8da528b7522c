"""The simulator's cost per iteration against the number of jobs queued (issue 12, item 1).

N requests of the Azure conversation trace arrive at once (OPT-13B/A100, batch 16, 4,096
blocks, a 40,000-block store) and the run stops at simulated time T1, then again at T2 (the
simulator's ``stop_above_s_per_token``, set to what the mean latency per token must exceed
by then). The difference in wall time over the difference in iterations is what one more
iteration costs with about N jobs waiting, the arrivals, the load and the first Steps left
out. Compiled core (``scheduler_svc/compiled.py``) unless FASTSERVE_COMPILED=0.

    python docs/bench-sim-queue/queue.py [--sizes 2000,20000,200000] [--policies ...]
"""

from __future__ import annotations

import argparse
import os
import pathlib
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from scheduler_svc import compiled  # noqa: E402

if os.environ.get("FASTSERVE_COMPILED", "1") != "0":
    compiled.activate()

from fastserve.traces import load_trace  # noqa: E402  (after the compiled core's finder)
from scheduler_svc.core.config import SchedulerConfig  # noqa: E402
from scheduler_svc.core.cost_model import PUBLISHED  # noqa: E402
from scheduler_svc.sim import simulate  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def until(requests: list, policy: str, kv: str, t: float,
          starve_limit_s: float | None) -> tuple[float, int]:
    """Wall seconds and iterations of a run stopped at simulated time ``t``."""
    inv = sum(1.0 / max(1, int(r.output_tokens)) for r in requests) / len(requests)
    starve = {} if starve_limit_s is None else {"starve_limit_s": starve_limit_s}
    config = SchedulerConfig(policy=policy, kv_policy=kv, max_batch_size=16, **starve)
    start = time.perf_counter()
    result = simulate(requests, config=config, cost_model=PUBLISHED["opt-13b-a100"],
                      num_blocks=4096, store_blocks=40_000, stop_above_s_per_token=t * inv,
                      prediction_sigma=0.75 if policy == "predictive" else None)
    return time.perf_counter() - start, result.num_iterations


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", default="2000,20000,200000")
    p.add_argument("--policies", default="fcfs+defer,skip-join-mlfq+defer,predictive+defer,"
                   "srpt-oracle+defer,skip-join-mlfq+proactive,predictive+proactive")
    p.add_argument("--t1", type=float, default=60.0)
    p.add_argument("--t2", type=float, default=360.0)
    p.add_argument("--starve-limit", type=float, default=None,
                   help="the policies' starvation limit, seconds (default: the scheduler's). "
                   "All N arrive at once, so their deadlines fall due together, and the "
                   "jobs promoted per iteration grow with N here; under steady arrivals "
                   "they come at the arrival rate")
    args = p.parse_args()
    print(f"core {'compiled' if compiled.active() else 'interpreted'}; marginal cost per "
          f"iteration between {args.t1:g} and {args.t2:g} simulated seconds; starvation limit "
          f"{'default' if args.starve_limit is None else f'{args.starve_limit:g} s'}")
    print(f"{'policy':28s} {'queued':>8s} {'iterations':>11s} {'wall s':>8s} {'us/iteration':>13s}")
    for pair in args.policies.split(","):
        policy, kv = pair.split("+")
        for n in (int(x) for x in args.sizes.split(",")):
            requests = load_trace(TRACE, rate=1e6, num_requests=n)
            w1, i1 = until(requests, policy, kv, args.t1, args.starve_limit)
            w2, i2 = until(requests, policy, kv, args.t2, args.starve_limit)
            per = (w2 - w1) / max(i2 - i1, 1) * 1e6
            print(f"{pair:28s} {n:8d} {i2 - i1:11d} {w2 - w1:8.2f} {per:13.1f}", flush=True)


if __name__ == "__main__":
    main()
