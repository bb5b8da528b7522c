"""What recomputation costs an overloaded simulation under the `recompute` KV policy: the time
the dropped KV takes to compute again, as a share of the group's compute, split by who dropped
it (a new job making room, a started job growing by a block, the last resort)
(docs/benchmarks.md, "Recomputation: the smallest KV that covers the need").

    python docs/overload/recompute_cost.py POLICY KV_POLICY NUM_REQUESTS RATE TRACE

Settings of docs/overload/published.py (OPT-13B/A100, batch 16, 4,096 blocks, a 40,000-block
store, `predictive` at sigma 0.75, every iteration planned). Instruments KVLedger.drop from
outside (run with FASTSERVE_COMPILED=0); changes nothing.
"""

from __future__ import annotations

import sys
import traceback
from collections import Counter

from published import run

from scheduler_svc.core.kv import ledger as kv_ledger

PATHS = {"_grow_room": "a started job growing", "_make_room": "the last resort",
         "form": "a new job making room"}


def main() -> None:
    count: Counter[str] = Counter()
    seconds: Counter[str] = Counter()
    holder: dict[str, kv_ledger.KVLedger] = {}
    drop = kv_ledger.KVLedger.drop

    def counted(self: kv_ledger.KVLedger, job, plan) -> None:
        names = [f.name for f in traceback.extract_stack(limit=8)]
        who = next((PATHS[n] for n in reversed(names) if n in PATHS), "other")
        before = self.num_dropped_s
        drop(self, job, plan)
        count[who] += 1
        seconds[who] += self.num_dropped_s - before
        holder["kv"] = self

    kv_ledger.KVLedger.drop = counted  # type: ignore[method-assign]
    r = run(lambda *_: None)
    s = r.summary
    print(f"{r.policy} + {r.kv} at {r.rate} req/s on {sys.argv[5].rsplit('/', 1)[-1]}: "
          f"{s['throughput_tokens_s']:.1f} tok/s, {s['num_recomputes']} recomputes")
    kv = holder.get("kv")
    if kv is None:
        print("  nothing dropped")
        return
    print(f"  dropped KV takes {kv.num_dropped_s:.1f} s to compute again, "
          f"{kv.num_dropped_s / max(kv.compute_s, 1e-9):.2%} of {kv.compute_s:.0f} s of compute")
    for who, n in count.most_common():
        print(f"  {who:24s} {n:5d} drops {seconds[who]:7.1f} s")


if __name__ == "__main__":
    main()
