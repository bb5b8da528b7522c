"""`predictive` against FCFS past capacity at the SLO runs' batch of 64 (issue 12): tokens/s,
mean JCT, mean latency per token and swap-outs, 1,000 requests, OPT-13B/A100, 4,096 blocks, a
40,000-block store, sigma 0.75 with worker-timed predictions, arrival seed 0.

Usage (from the repository root): python docs/bench-predictive/displace_running/overload_b64.py
    RATIO TRACE:RATE:CV ...   (RATIO: displace_running_ratio; TRACE azure or sharegpt)
"""

from __future__ import annotations

import sys

from fastserve.traces import load_trace
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import PUBLISHED
from scheduler_svc.sim import simulate

TRACES = {"azure": "../shared/traces/AzureLLMInferenceTrace_conv.csv",
          "sharegpt": "../shared/traces/sharegpt_lengths_llama2.csv"}


def main() -> None:
    ratio = float(sys.argv[1])
    for spec in sys.argv[2:]:
        trace, rate, cv = spec.split(":")
        reqs = load_trace(TRACES[trace], rate=float(rate), arrivals="gamma", cv=float(cv),
                          num_requests=1000, seed=0)
        rows = []
        for policy in ("fcfs", "predictive"):
            config = SchedulerConfig(policy=policy, max_batch_size=64, displace_running_ratio=ratio)
            r = simulate(reqs, config=config, cost_model=PUBLISHED["opt-13b-a100"],
                         num_blocks=4096, store_blocks=40000, rate=float(rate),
                         prediction_sigma=0.75, prediction_refresh=16)
            s = r.summary()
            rows.append((s["throughput_tokens_s"], s["mean_jct_s"],
                         s["mean_latency_per_token_s"] * 1e3, r.num_swap_outs))
        (f_tok, f_jct, f_ms, _), (p_tok, p_jct, p_ms, p_swaps) = rows
        print(f"{spec:16s} ratio {ratio:g}: fcfs {f_tok:6.1f} tok/s {f_jct:6.1f} s "
              f"{f_ms:7.1f} ms | predictive {p_tok:6.1f} tok/s ({p_tok / f_tok:.3f}x) "
              f"{p_jct:6.1f} s {p_ms:6.1f} ms, {p_swaps} swap-outs", flush=True)


if __name__ == "__main__":
    main()
