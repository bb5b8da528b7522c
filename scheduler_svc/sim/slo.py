"""Throughput at an SLO: the highest arrival rate whose simulated mean latency per output
token stays under it (the paper's headline metric), searched over ``simulate()`` runs."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.sim.simulator import RequestLike, simulate


@dataclass(frozen=True)
class SloPoint:
    rate: float
    mean_latency_per_token_s: float
    meets_slo: bool
    summary: dict  # empty when the run was ended early
    lower_bound: bool = False  # the run ended once the SLO was certainly missed: the
    # latency figure is a lower bound


@dataclass
class SloSearch:
    """``rate``: the highest rate tried whose mean latency per token met the SLO (None: none)."""

    policy: str
    slo_s_per_token: float
    rate: float | None
    curve: list[SloPoint] = field(default_factory=list)  # by rate


def default_slo(cost_model: CostModel) -> float:
    """The paper's SLO: mean latency per output token under 10x one decode iteration."""
    return 10.0 * cost_model.min_iteration_time


def throughput_at_slo(
    requests_fn: Callable[[float], Sequence[RequestLike]],
    rates: Iterable[float],
    slo_s_per_token: float | None = None,
    *,
    config: SchedulerConfig,
    cost_model: CostModel,
    num_blocks: int,
    block_size: int = 16,
    max_context: int | None = None,
    refine_steps: int = 0,
    stop_at_first_miss: bool = True,
    progress: Callable[[int], None] | None = None,
    store_blocks: int = 0,
    **options: Any,
) -> SloSearch:
    """The highest arrival rate whose mean latency per output token stays under the SLO.

    A grid search over ``rates`` (ascending; ``requests_fn(rate)`` builds the trace at each),
    then ``refine_steps`` bisections between the best passing rate and the first failing one.
    Past the knee every job queues, so by default the grid stops at the first miss: those runs
    are the slowest to simulate and cannot change the answer when latency grows with load.
    ``options``: the rest of ``simulate``'s (predictions, replicas...), for every run.
    """
    slo = default_slo(cost_model) if slo_s_per_token is None else slo_s_per_token
    search = SloSearch(config.policy, slo, None)

    def run(rate: float) -> bool:
        result = simulate(requests_fn(rate), config=config, cost_model=cost_model,
                          num_blocks=num_blocks, block_size=block_size,
                          max_context=max_context, rate=rate, progress=progress,
                          store_blocks=store_blocks, stop_above_s_per_token=slo,
                          **options)
        if result.stopped_at_s_per_token is not None:  # a certain miss, ended early
            search.curve.append(SloPoint(rate, result.stopped_at_s_per_token, False, {},
                                         lower_bound=True))
            return False
        s = result.summary()
        ok = s["mean_latency_per_token_s"] <= slo
        search.curve.append(SloPoint(rate, s["mean_latency_per_token_s"], ok, s))
        if ok and (search.rate is None or rate > search.rate):
            search.rate = rate
        return ok

    first_miss = None
    for rate in sorted(rates):
        if not run(rate) and first_miss is None:
            first_miss = rate
            if stop_at_first_miss:
                break
    if first_miss is not None and search.rate is not None and search.rate < first_miss:
        lo, hi = search.rate, first_miss
        for _ in range(refine_steps):
            mid = (lo + hi) / 2
            if run(mid):
                lo = mid
            else:
                hi = mid
    search.curve.sort(key=lambda p: p.rate)
    return search
