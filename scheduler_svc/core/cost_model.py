"""Predicted iteration times, from a worker's profile or from published constants.

The same object serves skip-join placement and quanta in the scheduler, and the clock of the
simulator, so a policy is evaluated in simulation with the costs it is scheduled with.
"""

from __future__ import annotations

import bisect
import itertools
from dataclasses import dataclass


def _interp(points: tuple[tuple[float, float], ...], x: float) -> float:
    """Piecewise-linear through ``points`` (sorted by x), extrapolated linearly at both ends."""
    xs = [p[0] for p in points]
    if len(points) == 1:
        return points[0][1] * max(x, 1.0) / max(xs[0], 1.0)
    i = min(max(bisect.bisect_left(xs, x), 1), len(points) - 1)
    (x0, y0), (x1, y1) = points[i - 1], points[i]
    y = y0 + (y1 - y0) * (x - x0) / (x1 - x0)
    return max(y, 0.0)


@dataclass(frozen=True)
class CostModel:
    """Iteration time as a function of the work in it.

    ``decode``: (batch size, seconds) for iterations of one token per job;
    ``prefill``: (prompt tokens, seconds) for one job's prompt in one iteration.
    A mixed iteration costs its prefill tokens' prefill time plus its decode jobs' decode time
    less one iteration's fixed cost (the weights are read once per iteration).
    """

    decode: tuple[tuple[float, float], ...]
    prefill: tuple[tuple[float, float], ...]
    name: str = "profile"
    source: str = ""
    # KV swaps between the device and the node's KV store: bytes of KV per token (all layers,
    # keys and values) and the copy bandwidth one way. 0 = swaps cost nothing.
    kv_bytes_per_token: int = 0
    swap_bytes_per_s: float = 0.0

    def __post_init__(self) -> None:
        for label, pts in (("decode", self.decode), ("prefill", self.prefill)):
            if not pts:
                raise ValueError(f"cost model needs at least one {label} point")
            if any(b[0] <= a[0] for a, b in itertools.pairwise(pts)):
                raise ValueError(f"cost model {label} points must have increasing sizes: {pts}")
            if any(t <= 0 for _, t in pts):
                raise ValueError(f"cost model {label} times must be > 0: {pts}")

    @property
    def min_iteration_time(self) -> float:
        """One decode iteration at batch 1: the quantum of the highest-priority queue."""
        return self.decode_time(1)

    def decode_time(self, batch_size: int) -> float:
        return _interp(self.decode, batch_size)

    def prefill_time(self, num_tokens: int) -> float:
        return _interp(self.prefill, num_tokens)

    def iteration_time(self, num_decodes: int, prefill_tokens: int) -> float:
        """An iteration with ``num_decodes`` one-token jobs and ``prefill_tokens`` others."""
        if prefill_tokens <= 0:
            return self.decode_time(max(num_decodes, 1))
        t = self.prefill_time(prefill_tokens)
        if num_decodes > 0:
            # prefill_time(1) is an iteration's fixed cost, already paid by the prefill.
            t += max(self.decode_time(num_decodes) - self.prefill_time(1), 0.0)
        return t

    def swap_time(self, num_blocks: int, block_size: int) -> float:
        """Seconds to copy ``num_blocks`` KV blocks one way between device and store."""
        if self.swap_bytes_per_s <= 0:
            return 0.0
        return num_blocks * block_size * self.kv_bytes_per_token / self.swap_bytes_per_s

    @classmethod
    def from_profile(cls, decode: list[tuple[int, float]], prefill: list[tuple[int, float]],
                     name: str = "profile") -> CostModel:
        return cls(tuple(sorted((float(b), t) for b, t in decode)),
                   tuple(sorted((float(n), t) for n, t in prefill)), name=name)


# OPT-13B on one A100-80GB (FP16), as reported for FasterTransformer-class engines: a decode
# iteration ~24 ms at batch 1 rising to ~38 ms at batch 32 (memory-bound), and prefill
# ~0.16 ms per token (compute-bound, ~26 TFLOP/s effective on 2 x 13e9 FLOP per token).
# Sources: the FastServe paper's setup (arXiv 2305.05920, section 6: OPT-13B, one A100) and
# the Orca / vLLM papers' OPT-13B latency figures; see docs/benchmarks.md.
OPT_13B_A100 = CostModel(
    decode=((1, 0.024), (8, 0.026), (16, 0.029), (32, 0.038), (64, 0.055), (128, 0.090)),
    prefill=((1, 0.024), (128, 0.040), (512, 0.090), (1024, 0.170), (2048, 0.340)),
    name="opt-13b-a100",
    source=("FastServe (arXiv 2305.05920) setup; Orca (OSDI'22) and vLLM (SOSP'23) OPT-13B "
            "latencies"),
    # 2 (K, V) x 40 layers x 5120 hidden x 2 bytes (FP16); PCIe 4.0 x16 host copies from
    # pinned memory at ~25 GB/s.
    kv_bytes_per_token=2 * 40 * 5120 * 2,
    swap_bytes_per_s=25e9,
)

PUBLISHED = {OPT_13B_A100.name: OPT_13B_A100}
