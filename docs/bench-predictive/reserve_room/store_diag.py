"""Why a long prompt waits longer with a store (docs/benchmarks.md, "Room held for the first
new job that waits"): `predictive`, 1,000 Azure conversations, CV 4, 2.5 req/s, sigma 0.75, a
40,000-block store, interpreted core with counters patched in: how often the room for new jobs
is zero (copy engine busy, store full), how often a prompt over 2,000 tokens finds its shortfall
above the room, how often displacement for it frees anything, and how many block holders are
paused (displaceable) per Step. Usage (from the repository root):
    FASTSERVE_COMPILED=0 python docs/bench-predictive/reserve_room/store_diag.py
"""

from __future__ import annotations

import collections

from fastserve.traces import load_trace
from scheduler_svc.core import batcher
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import PUBLISHED
from scheduler_svc.core.kv import displace, policies
from scheduler_svc.sim import simulate

LONG = 2000  # prompt tokens
count: collections.Counter[str] = collections.Counter()
new_job_room = policies.KVPolicy.new_job_room
short = batcher.Batcher._short
make = displace.Displacement.make
form = batcher.Batcher.form


def counted_room(self, displaceable, iteration_s, claimed):
    busy = self.ledger.copies.backlog() > 2 * iteration_s
    count["room_calls"] += 1
    count["room_zero_copy_busy"] += busy
    count["room_zero_store_full"] += not busy and self.ledger.store_free() == 0
    return new_job_room(self, displaceable, iteration_s, claimed)


def counted_short(self, job, n):
    lacks = short(self, job, n)
    if len(job.prompt) > LONG and not job.started:
        ledger = self.ledger
        room = new_job_room(self.kv_policy, ledger.allocator.num_used - ledger.num_outgoing(),
                            0.1, 0)
        count["long_checks"] += 1
        count["long_short_above_room"] += lacks > room
    return lacks


def counted_make(self, job, lacks, keep):
    if len(job.prompt) <= LONG or job.started:
        return make(self, job, lacks, keep)
    before = self.ledger.num_free + self.ledger.num_outgoing()
    make(self, job, lacks, keep)
    count["long_displacements"] += 1
    count["long_displacements_that_freed"] += (self.ledger.num_free
                                              + self.ledger.num_outgoing() > before)
    return None


def counted_form(self, step, *args):
    form(self, step, *args)
    holding = self.ledger.holding
    count["steps"] += 1
    count["holders"] += len(holding)
    count["paused_holders"] += sum(1 for j in holding.values() if j.job_id not in step.chosen)


def main() -> None:
    policies.KVPolicy.new_job_room = counted_room
    batcher.Batcher._short = counted_short
    displace.Displacement.make = counted_make
    batcher.Batcher.form = counted_form
    reqs = load_trace("../shared/traces/AzureLLMInferenceTrace_conv.csv", rate=2.5,
                      arrivals="gamma", cv=4.0, num_requests=1000, seed=0)
    result = simulate(reqs, config=SchedulerConfig(policy="predictive"),
                      cost_model=PUBLISHED["opt-13b-a100"], num_blocks=4096, rate=2.5,
                      store_blocks=40000, prediction_sigma=0.75, prediction_seed=0,
                      prediction_refresh=16)
    print(dict(count))
    print(f"per planned Step: {count['holders'] / count['steps']:.1f} jobs hold blocks, "
          f"{count['paused_holders'] / count['steps']:.2f} of them paused")
    s = result.summary()
    print({k: v for k, v in s.items() if "swap" in k or "recomp" in k or "preempt" in k})


if __name__ == "__main__":
    main()
