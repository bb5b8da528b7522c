"""The run that docs/overload/phases.py and drain.py instrument: POLICY KV_POLICY NUM_REQUESTS
RATE TRACE from the command line, simulated at the published scale (OPT-13B/A100, batch 16,
4,096 blocks, a 40,000-block store, `predictive` at prediction sigma 0.75), every iteration
planned (no fast-forward) so that each is counted.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from fastserve.traces import load_trace
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import StepPlan
from scheduler_svc.core.cost_model import OPT_13B_A100
from scheduler_svc.core.group import GroupCore
from scheduler_svc.sim.simulator import simulate

BATCH, BLOCKS = 16, 4096


@dataclass
class Run:
    policy: str
    kv: str
    rate: float
    last_arrival_s: float
    summary: dict[str, Any]


def run(each: Callable[[GroupCore, float, StepPlan | None, float], None]) -> Run:
    """Simulate the run the command line names, calling ``each(core, now, plan, last arrival)``
    after every ``GroupCore.schedule`` (instrumented from outside; it changes nothing)."""
    policy, kv, n, rate, trace = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                  float(sys.argv[4]), sys.argv[5])
    reqs = load_trace(trace, rate=rate, num_requests=n, seed=0)
    last = max(r.arrival_s for r in reqs)
    schedule = GroupCore.schedule

    def counted(self: GroupCore, now: float) -> StepPlan | None:
        plan = schedule(self, now)
        each(self, now, plan, last)
        return plan

    GroupCore.schedule = counted  # type: ignore[method-assign]
    sigma = 0.75 if policy == "predictive" else None
    s = simulate(reqs, config=SchedulerConfig(policy=policy, kv_policy=kv, max_batch_size=BATCH),
                 cost_model=OPT_13B_A100, num_blocks=BLOCKS, store_blocks=40000,
                 fast_forward=False, prediction_sigma=sigma).summary()
    return Run(policy, kv, rate, last, s)
