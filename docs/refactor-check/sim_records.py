"""Per-request simulator results, for checking that a refactor keeps behaviour.

Run from the repository root, once on the code before and once after:
    SG_N=600 python docs/refactor-check/sim_records.py OUT_DIR [RUN_NAME...]
Each run writes OUT_DIR/NAME.json (every request's arrival, first token, finish and lengths,
and the run's counters, as sorted JSON) and prints its SHA-256 prefix; compare with cmp.
Runs: six policies on the Azure conversation trace (1,500 requests; defer at 1.5 req/s, and
proactive with a 40,000-block store at 2.5 req/s, overload), and fcfs and skip-join-mlfq with
each KV policy and a 20,000-block store on ShareGPT lengths with Gamma arrivals (CV 4, 2 req/s;
SG_N requests, default 1,500); and `predictive` (lognormal prediction error, sigma 0 and 0.75)
with each KV policy on the conversations at 2.5 req/s. OPT-13B/A100 cost model, 4,096 blocks,
batch 16.
FASTSERVE_COMPILED=1 runs them on the core compiled with mypyc (scheduler_svc/compiled.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import pathlib
import sys

from scheduler_svc import compiled

if os.environ.get("FASTSERVE_COMPILED") == "1":  # the core compiled with mypyc: same records
    compiled.activate()

from fastserve.traces import load_trace  # after the compiled core's finder
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import PUBLISHED
from scheduler_svc.sim import simulate

TRACES = pathlib.Path("../shared/traces")
POLICIES = ("fcfs", "rtc", "skip-join-mlfq", "mlfq", "fixed-priority", "srpt-oracle")


def runs() -> list[tuple[str, list, str, str, int, float | None]]:
    def conv(rate: float) -> list:
        return load_trace(TRACES / "AzureLLMInferenceTrace_conv.csv", rate=rate,
                          num_requests=1500)

    def sharegpt() -> list:
        return load_trace(TRACES / "sharegpt_lengths_llama2.csv", rate=2.0, arrivals="gamma",
                          cv=4.0, num_requests=int(os.environ.get("SG_N", "1500")), seed=1)

    out = []
    for policy in POLICIES:
        out.append((f"conv-{policy}-defer", conv(1.5), policy, "defer", 0, None))
        out.append((f"conv-{policy}-proactive-store", conv(2.5), policy, "proactive", 40000,
                    None))
    for policy in ("fcfs", "skip-join-mlfq"):
        for kv in ("proactive", "reactive", "recompute", "defer"):
            out.append((f"sharegpt-{policy}-{kv}", sharegpt(), policy, kv, 20000, None))
    for sigma in (0.0, 0.75):
        for kv in ("proactive", "reactive", "recompute", "defer"):
            out.append((f"conv-predictive-s{sigma}-{kv}", conv(2.5), "predictive", kv, 40000,
                        sigma))
    return out


def main() -> None:
    out_dir = pathlib.Path(sys.argv[1])
    out_dir.mkdir(parents=True, exist_ok=True)
    only = set(sys.argv[2:])
    for name, requests, policy, kv, store, sigma in runs():
        if only and name not in only:
            continue
        config = SchedulerConfig(policy=policy, kv_policy=kv, max_batch_size=16)
        r = simulate(requests, config=config, cost_model=PUBLISHED["opt-13b-a100"],
                     num_blocks=4096, store_blocks=store, prediction_sigma=sigma)
        data = {"records": [dataclasses.astuple(x) for x in r.records],
                "counters": {k: v for k, v in dataclasses.asdict(r).items() if k != "records"}}
        text = json.dumps(data, sort_keys=True)
        (out_dir / f"{name}.json").write_text(text)
        print(name, hashlib.sha256(text.encode()).hexdigest()[:16], len(r.records),
              f"{r.sim_end_s:.1f}", flush=True)


if __name__ == "__main__":
    main()
