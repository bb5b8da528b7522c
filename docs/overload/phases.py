"""Throughput before and after the last arrival of an overloaded simulation: whether a
policy loses tokens/s while requests arrive (churn) or only in the drain, where the jobs it put
off run last (docs/benchmarks.md, "Overload on traces the matrix had not seen").

    python docs/overload/phases.py POLICY KV_POLICY NUM_REQUESTS RATE TRACE

OPT-13B/A100 cost model, batch 16, 4,096 blocks, a 40,000-block store, `predictive` at
prediction sigma 0.75; every iteration planned (no fast-forward), so each is counted.
Instruments GroupCore.schedule from outside; changes nothing.
"""

from __future__ import annotations

import sys

from fastserve.traces import load_trace
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import OPT_13B_A100
from scheduler_svc.core.group import GroupCore
from scheduler_svc.sim.simulator import simulate


def main() -> None:
    policy, kv, n, rate, trace = (sys.argv[1], sys.argv[2], int(sys.argv[3]),
                                  float(sys.argv[4]), sys.argv[5])
    iterations: list[tuple[float, int, float, int]] = []  # (start, decodes, compute s, prefill)
    schedule = GroupCore.schedule

    def counted(self, now):
        plan = schedule(self, now)
        if plan is not None and plan.commands:
            decodes = sum(1 for c in plan.commands if c.num_tokens == 1)
            prefill = sum(c.num_tokens for c in plan.commands if c.num_tokens > 1)
            iterations.append((now, decodes, OPT_13B_A100.iteration_time(decodes, prefill),
                               prefill))
        return plan

    GroupCore.schedule = counted
    reqs = load_trace(trace, rate=rate, num_requests=n, seed=0)
    last = max(r.arrival_s for r in reqs)
    sigma = 0.75 if policy == "predictive" else None
    s = simulate(reqs, config=SchedulerConfig(policy=policy, kv_policy=kv, max_batch_size=16),
                 cost_model=OPT_13B_A100, num_blocks=4096, store_blocks=40000,
                 fast_forward=False, prediction_sigma=sigma).summary()
    print(f"{policy} + {kv}: {s['throughput_tokens_s']:.1f} tok/s over {s['makespan_s']:.0f} s, "
          f"last arrival at {last:.0f} s")
    for name, drain in (("while arriving", False), ("drain", True)):
        part = [it for it in iterations if (it[0] > last) == drain]
        decodes, compute = sum(it[1] for it in part), sum(it[2] for it in part)
        each = max(len(part), 1)
        print(f"  {name:15s} {len(part):6d} iterations, {decodes / each:5.2f} decodes and "
              f"{sum(it[3] for it in part) / each:5.1f} prompt tokens each, "
              f"{decodes / max(compute, 1e-9):6.1f} decoded tok/s of compute, "
              f"{compute:6.0f} s of compute")


if __name__ == "__main__":
    main()
