"""What a policy sustains on a trace at the SLO runs' settings, against the rates at which the
SLO searches find it under the SLO (docs/benchmarks.md, "Throughput at the SLO is bounded by
capacity").

Each policy is run far past capacity (Poisson at RATE, N requests, OPT-13B/A100, batch 64,
4,096 blocks, a 40,000-block store; `predictive` with sigma 0.75 predictions timed as the worker
makes them): N over its makespan is what it served with the whole trace queued (the drain
included, so a little under what it sustains). The rate of output tokens while requests
waited, which `fastserve.bench.capacity` takes on the real cluster, is no measure here: on
these heavy-tailed traces the jobs served in that window are not the trace's mix (FCFS's
came out above the bound below on ShareGPT).

Beside them, the bound of `scheduler_svc/sim/bound.py` (what `fastserve sim --slo-search` now
prints): the least time any policy could take over these requests, from the cost model and
the pool alone, and N over it.

Usage (repository root): python docs/bench-predictive/slo_seeds/capacity.py TRACE [N] [RATE]
    [POLICY ...]   (defaults: 3000 requests, 12 req/s, fcfs predictive srpt-oracle)
"""

from __future__ import annotations

import sys

from fastserve.traces import load_trace
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import PUBLISHED
from scheduler_svc.sim import simulate, sustainable_rate


def main() -> None:
    trace = sys.argv[1]
    n = int(sys.argv[2]) if len(sys.argv) > 2 else 3000
    rate = float(sys.argv[3]) if len(sys.argv) > 3 else 12.0
    policies = sys.argv[4:] or ["fcfs", "predictive", "srpt-oracle"]
    reqs = load_trace(trace, rate=rate, arrivals="poisson", num_requests=n, seed=0)
    cost = PUBLISHED["opt-13b-a100"]
    bound = sustainable_rate(reqs, cost_model=cost, num_blocks=4096)
    assert bound is not None
    print(f"{trace}: {n} requests at {rate} req/s (Poisson)")
    print(f"  bound for any policy: at least {bound.iterations:,.0f} iterations"
          f" (the {bound.binds} binds), {bound.least_s:,.0f} s: {bound.rate:.2f} req/s")
    for policy in policies:
        res = simulate(reqs, config=SchedulerConfig(policy=policy), cost_model=cost,
                       num_blocks=4096, rate=rate, store_blocks=40000, prediction_sigma=0.75,
                       prediction_refresh=16)
        print(f"  {policy:12s} served {n / res.sim_end_s:.2f} req/s over its makespan"
              f" ({res.sim_end_s:,.0f} s, {res.num_iterations:,} iterations,"
              f" {res.num_swap_outs} swap-outs)")


if __name__ == "__main__":
    main()
