"""What one walk of the ranked jobs does under overload: jobs handed to the batcher, jobs
passed (``WalkSkip``), buckets crossed, started jobs read, per walk. Interpreted core (the
counts do not depend on it).

    FASTSERVE_COMPILED=0 python docs/bench-sim-queue/walk/walk_counts.py POLICY N

Azure conversations at 3.6 req/s (twice FCFS's capacity), OPT-13B/A100, batch 16, 4,096
blocks, a 40,000-block store, ``defer``; sigma 0.75 for ``predictive``.
"""

from __future__ import annotations

import collections
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from fastserve.traces import load_trace  # noqa: E402
from scheduler_svc.core.config import SchedulerConfig  # noqa: E402
from scheduler_svc.core.cost_model import PUBLISHED  # noqa: E402
from scheduler_svc.core.policies import ranked  # noqa: E402
from scheduler_svc.sim import simulate  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "AzureLLMInferenceTrace_conv.csv"


def main() -> None:
    policy, n = sys.argv[1], int(sys.argv[2])
    counts: collections.Counter[str] = collections.Counter()
    skips: list[ranked.WalkSkip] = []
    init, walk_init, next_job = (ranked.WalkSkip.__init__, ranked.FreshWalk.__init__,
                                 ranked.FreshWalk.next_job)

    def skip_init(self, claimed):  # type: ignore[no-untyped-def]
        init(self, claimed)
        skips.append(self)
        counts["claimed"] += len(claimed)

    def started(self, fresh, ran, skip):  # type: ignore[no-untyped-def]
        walk_init(self, fresh, ran, skip)
        counts["walks"] += 1
        counts["started jobs"] += len(ran)
        counts["jobs not yet run"] += len(fresh)

    def handed(self):  # type: ignore[no-untyped-def]
        b = self.b
        job = next_job(self)
        counts["buckets crossed"] += self.b - b
        counts["handed out"] += job is not None
        return job

    ranked.WalkSkip.__init__ = skip_init  # type: ignore[method-assign]
    ranked.FreshWalk.__init__ = started  # type: ignore[method-assign]
    ranked.FreshWalk.next_job = handed  # type: ignore[method-assign]
    requests = load_trace(TRACE, rate=3.6, num_requests=n)
    simulate(requests, config=SchedulerConfig(policy=policy, kv_policy="defer",
                                              max_batch_size=16),
             cost_model=PUBLISHED["opt-13b-a100"], num_blocks=4096, store_blocks=40_000,
             prediction_sigma=0.75 if policy == "predictive" else None)
    counts["passed"] = sum(s.passed for s in skips)
    walks = counts.pop("walks")
    print(f"{policy}, {n} requests: {walks} walks ({walks / n:.2f} a request); per walk:")
    for name, value in counts.items():
        print(f"  {name:<18} {value / walks:10.2f}")


if __name__ == "__main__":
    main()
