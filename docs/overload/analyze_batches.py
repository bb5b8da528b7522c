"""Where an overloaded simulation's throughput goes: the composition of every iteration, and
for every short batch (fewer jobs than the batch size while enough are live) why each
device-resident job was left out (docs/benchmarks.md, issue 12).

    python docs/overload/analyze_batches.py POLICY KV_POLICY NUM_REQUESTS RATE [TRACE]

The Azure conversation trace unless TRACE says otherwise; OPT-13B/A100 cost model, batch 16,
4,096 blocks, 40,000 store blocks; every iteration planned (no fast-forward). Instruments
GroupCore.schedule and Batcher.form from outside; changes nothing.
"""

from __future__ import annotations

import collections
import pathlib
import sys
import time

from fastserve.traces import load_trace
from scheduler_svc.core.batcher import Batcher
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import OPT_13B_A100
from scheduler_svc.core.group import GroupCore
from scheduler_svc.sim.simulator import simulate

SHARED = pathlib.Path(__file__).resolve().parents[3] / "shared"
TRACE = SHARED / "traces" / "AzureLLMInferenceTrace_conv.csv"
BATCH = 16


def main() -> None:
    policy, kv, n, rate = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    stats: collections.Counter[str] = collections.Counter()
    cores: list[GroupCore] = []
    schedule, form, init = GroupCore.schedule, Batcher.form, GroupCore.__init__

    def counted_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        cores.append(self)

    def counted_schedule(self, now):
        plan = schedule(self, now)
        if plan is not None and plan.commands:
            decodes = sum(1 for c in plan.commands if c.num_tokens == 1)
            prefill = sum(c.num_tokens for c in plan.commands if c.num_tokens > 1)
            stats["iterations"] += 1
            stats["decodes"] += decodes
            stats["prefill_tokens"] += prefill
            stats["compute_s"] += OPT_13B_A100.iteration_time(decodes, prefill)
        return plan

    def counted_form(self, step, num_live, *waiting):
        form(self, step, num_live, *waiting)
        if len(step.plan.commands) >= BATCH or num_live < BATCH:
            return
        ledger, bs = self.ledger, self.ledger.block_size
        stats["short"] += 1
        stats["short: empty slots"] += BATCH - len(step.plan.commands)
        stats["short: free blocks"] += ledger.num_free
        for job in ledger.holding.values():
            if job.job_id in step.chosen:
                continue
            if job.job_id not in step.rank:
                why = "not reached by the walk"
            elif job.num_pending > 1:
                why = "prefilling"
            elif job.kv.num_computed >= len(job.kv.blocks) * bs:
                why = "needs a block"
            elif ledger.upload_pending(job, step.now):
                why = "upload copying"
            else:
                why = "other"
            stats[f"short: idle, {why}"] += 1

    GroupCore.__init__, GroupCore.schedule, Batcher.form = (counted_init, counted_schedule,
                                                            counted_form)
    trace = sys.argv[5] if len(sys.argv) > 5 else str(TRACE)
    reqs = load_trace(trace, rate=rate, num_requests=n, seed=0)
    config = SchedulerConfig(policy=policy, kv_policy=kv, max_batch_size=BATCH)
    start = time.time()
    s = simulate(reqs, config=config, cost_model=OPT_13B_A100, num_blocks=4096,
                 store_blocks=40000, rate=rate, fast_forward=False).summary()
    print(f"{policy} + {kv}: {s['throughput_tokens_s']:.1f} tok/s, mean JCT "
          f"{s['mean_jct_s']:.1f} s, {s['num_swap_outs']} offloads, {s['num_recomputes']} "
          f"recomputes, swap wait {s['swap_wait_s']:.1f} s ({time.time() - start:.1f} s)")
    its = max(stats["iterations"], 1)
    print(f"{stats['iterations']} iterations, {stats['decodes'] / its:.2f} decodes each, "
          f"{stats['prefill_tokens']} prefill tokens, {stats['compute_s']:.1f} s of compute")
    short = max(stats["short"], 1)
    print(f"{stats['short']} short batches; per short batch:")
    for key in sorted(k for k in stats if k.startswith("short: ")):
        print(f"  {key[7:]:28s} {stats[key] / short:8.1f}")
    policy_obj = cores[-1].policy
    print(f"demotions {policy_obj.num_demotions}, promotions {policy_obj.num_promotions}")


if __name__ == "__main__":
    main()
