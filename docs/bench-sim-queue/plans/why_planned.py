"""Why the simulator plans nearly every iteration of a preemptive policy under overload.

``steady.window`` fast-forwards only from a plan that ``steady.repeatable`` accepts. This
counts, for every plan formed, the first reason it is not repeatable (no commands, new jobs,
a swap, probes, a first schedule, a prefill chunk, a job the walk read and left out, or new
jobs ``WalkSkip`` passed where a Step could displace paused KV for them), the plans that
repeat, the windows of at least one iteration (one plan can give several in a row), and the
MLFQ's demotions and promotions and the preemptions per request: a preemption ends any
window, a move that only reorders the batch does not. (Before windows went on past passed
jobs and arrivals, every plan whose walk passed a job counted as "ranked jobs left out".)
Interpreted core (the counts do not depend on it).

    FASTSERVE_COMPILED=0 python docs/bench-sim-queue/plans/why_planned.py POLICY KV N [RATE]

Azure conversations at RATE req/s (default 3.6, twice FCFS's capacity), OPT-13B/A100, batch
16, 4,096 blocks, a 40,000-block store; sigma 0.75 for ``predictive``.
"""

from __future__ import annotations

import collections
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from fastserve.traces import load_trace  # noqa: E402
from scheduler_svc.core import group, steady  # noqa: E402
from scheduler_svc.core.config import SchedulerConfig  # noqa: E402
from scheduler_svc.core.cost_model import PUBLISHED  # noqa: E402
from scheduler_svc.core.policies import mlfq  # noqa: E402
from scheduler_svc.sim import simulate, simulator  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def main() -> None:
    policy, kv, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    rate = float(sys.argv[4]) if len(sys.argv) > 4 else 3.6
    reasons: collections.Counter[str] = collections.Counter()
    plain = steady.repeatable

    def counted(plan, step):  # type: ignore[no-untyped-def]
        c = plan.commands
        reasons["no commands" if not c
                else "new jobs" if plan.new_jobs
                else "swap" if plan.swap_out or plan.swap_in
                else "probes" if plan.probes
                else "first schedule" if step.started
                else "prefill chunk" if any(x.num_tokens != 1 for x in c)
                else "read, left out" if len(step.rank) != len(c)
                else "passed, displacement possible" if step.passed and not step.passes_hold
                else "repeatable"] += 1
        return plain(plan, step)

    group.repeatable = counted  # what GroupCore.schedule calls
    windows = simulator.window

    def measured(core, *a, **k):  # type: ignore[no-untyped-def]
        starts = windows(core, *a, **k)
        if starts:
            reasons["  windows"] += 1
        return starts

    simulator.window = measured
    policies: list[mlfq.SkipJoinMLFQ] = []
    init = mlfq.SkipJoinMLFQ.__init__

    def kept(self, *a, **k):  # type: ignore[no-untyped-def]
        init(self, *a, **k)
        policies.append(self)

    mlfq.SkipJoinMLFQ.__init__ = kept  # type: ignore[method-assign]
    requests = load_trace(TRACE, rate=rate, num_requests=n)
    result = simulate(requests, config=SchedulerConfig(policy=policy, kv_policy=kv,
                                                       max_batch_size=16),
                      cost_model=PUBLISHED["opt-13b-a100"], num_blocks=4096,
                      store_blocks=40_000,
                      prediction_sigma=0.75 if policy == "predictive" else None)
    windowed = reasons.pop("  windows", 0)
    planned = sum(reasons.values())
    print(f"{policy} + {kv}, {n} requests at {rate:g} req/s: {result.num_iterations} "
          f"iterations, {planned} planned ({planned / n:.2f} per request), "
          f"{result.num_preemptions / n:.2f} preemptions per request")
    if policies:
        p = policies[-1]
        print(f"  demotions {p.num_demotions / n:.2f}, promotions {p.num_promotions / n:.2f} "
              "per request")
    for why, count in reasons.most_common():
        if why == "repeatable":
            print(f"  {why:30s} {count:7d}  {count / n:6.2f} per request; windows "
                  f"{windowed} ({windowed / n:.2f} per request)")
            continue
        print(f"  {why:30s} {count:7d}  {count / n:6.2f} per request")


if __name__ == "__main__":
    main()
