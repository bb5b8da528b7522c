"""Per-request records and the summary statistics shared by the simulator and the real-cluster
benchmark, so that both report the same figures under the same names.

| key                      | meaning (per request, then aggregated)                          |
|--------------------------|-----------------------------------------------------------------|
| jct                      | finish - arrival (job completion time)                          |
| ttft                     | first token - arrival                                           |
| latency_per_token        | jct / output tokens (the paper's per-token latency)             |
| throughput_tokens_s      | output tokens of all requests / makespan                        |
| makespan_s               | last finish - first arrival                                     |
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

SUMMARY_KEYS = (
    "policy", "num_requests", "rate",
    "mean_jct_s", "p50_jct_s", "p95_jct_s", "p99_jct_s",
    "mean_ttft_s", "p95_ttft_s",
    "mean_latency_per_token_s", "p95_latency_per_token_s",
    "throughput_tokens_s", "throughput_requests_s", "makespan_s",
)


class RecordLike(Protocol):
    @property
    def arrival_s(self) -> float: ...
    @property
    def first_token_s(self) -> float: ...
    @property
    def finish_s(self) -> float: ...
    @property
    def output_tokens(self) -> int: ...


@dataclass(frozen=True)
class RequestRecord:
    """One completed request, times in seconds on one clock."""

    arrival_s: float
    first_token_s: float
    finish_s: float
    input_tokens: int
    output_tokens: int

    @property
    def jct_s(self) -> float:
        return self.finish_s - self.arrival_s

    @property
    def ttft_s(self) -> float:
        return self.first_token_s - self.arrival_s


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) with linear interpolation (numpy's default method)."""
    if not values:
        raise ValueError("percentile of no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def offered_rate(arrivals: Sequence[float]) -> float:
    """Mean request rate of an arrival sequence: (n - 1) gaps over its span (0 if undefined)."""
    if len(arrivals) < 2:
        return 0.0
    span = max(arrivals) - min(arrivals)
    return (len(arrivals) - 1) / span if span > 0 else 0.0


def summarize(records: Sequence[RecordLike], policy: str, rate: float | None) -> dict:
    """The summary of completed requests under the keys in ``SUMMARY_KEYS``, in that order.

    ``rate`` is the offered request rate; None means "measure it from the arrivals".
    """
    if not records:
        raise ValueError(f"no completed requests to summarize for policy {policy!r}")
    jct = [r.finish_s - r.arrival_s for r in records]
    ttft = [r.first_token_s - r.arrival_s for r in records]
    per_token = [j / max(r.output_tokens, 1) for j, r in zip(jct, records)]
    arrivals = [r.arrival_s for r in records]
    makespan = max(r.finish_s for r in records) - min(arrivals)
    tokens = sum(r.output_tokens for r in records)
    n = len(records)
    return {
        "policy": policy,
        "num_requests": n,
        "rate": offered_rate(arrivals) if rate is None else float(rate),
        "mean_jct_s": sum(jct) / n,
        "p50_jct_s": percentile(jct, 50),
        "p95_jct_s": percentile(jct, 95),
        "p99_jct_s": percentile(jct, 99),
        "mean_ttft_s": sum(ttft) / n,
        "p95_ttft_s": percentile(ttft, 95),
        "mean_latency_per_token_s": sum(per_token) / n,
        "p95_latency_per_token_s": percentile(per_token, 95),
        "throughput_tokens_s": tokens / makespan if makespan > 0 else 0.0,
        "throughput_requests_s": n / makespan if makespan > 0 else 0.0,
        "makespan_s": makespan,
    }
