"""The highest arrival rate any policy could sustain on a trace: a bound from the cost model
and the KV pool alone, beside which a throughput at the SLO can be read.

A finite trace can meet the SLO at a rate no scheduler sustains: the run ends before the queue
it builds breaks the mean, and the policies that serve short jobs first hide that queue longest
(the jobs left behind are the long ones, whose latency per token their length divides). So a
throughput at the SLO above this bound is a transient of the trace's length, not a capacity.

Why it is a bound. An iteration with n decodes and P prompt tokens takes, in
``CostModel.iteration_time``, ``prefill(P) + decode(n) - prefill(1)`` (or ``decode(n)``,
``prefill(P)`` alone), which is at least ``f + a (n - 1)+ + b (P - 1)+``: f the lesser of
``decode(1)`` and ``prefill(1)``, a the least chord slope of ``decode`` from 1 up to the batch
limit, b that of ``prefill`` up to the token budget. A job decoding its k-th output token holds
the blocks of ``input + k`` tokens on the device, so the iterations number at least ``I = max(D
/ max_batch_size, M / num_blocks)``, D the output tokens after each job's first (the first comes
with the prompt's last chunk) and M the sum of those blocks over every decode. Summed over the
iterations, the time is at least ``I (f - a - b) + a D + b P`` (P all prompt tokens; a one-token
prompt's, which joins as a decode, at the lesser of a and b), which grows with I when ``f >= a +
b`` (every published model: the fixed cost of reading the weights dominates), so I's least value
gives the least time (otherwise the time is at least the larger of that sum and ``f I``, least
where the two cross). No order, batching, preemption or offloading serves the trace faster, and
none sustains more than N requests over that time. It is close where the batch limit binds (FCFS
on equal jobs: within 1%) and looser where the pool does (0.79-0.83 of FCFS's makespan there,
0.82 on the Azure conversations): it counts no prompt's blocks during its prefill, no reserve
the pool keeps free and no recomputation. Groups in ``replicas`` multiply it; a pipelined group
(several batches in flight) is not covered (``None``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.sim.simulator import RequestLike, fit_to_context


@dataclass(frozen=True)
class RateBound:
    """``rate``: requests per second no policy sustains more than (``requests`` over
    ``least_s``, times the replicas); ``iterations``: the least number of iterations over
    all groups together, and ``binds``: what sets it ("batch" or "pool")."""

    rate: float
    least_s: float
    iterations: float
    binds: str
    requests: int


def _blocks_up_to(n: int, block_size: int) -> int:
    """The sum over t = 1..n of the blocks that t tokens take."""
    q, r = divmod(n, block_size)
    return block_size * q * (q + 1) // 2 + r * (q + 1)


def _least_chord(curve: Callable[[int], float], top: int) -> float:
    """The least slope of ``curve`` from 1 to any integer size up to ``top``."""
    at_one = curve(1)
    return min((curve(x) - at_one) / (x - 1) for x in range(2, max(top, 2) + 1))


def sustainable_rate(requests: Iterable[RequestLike], *, cost_model: CostModel,
                     num_blocks: int, block_size: int = 16, max_batch_size: int = 64,
                     max_batched_tokens: int = 512, max_context: int | None = None,
                     replicas: int = 1) -> RateBound | None:
    """The bound of the module doc for ``requests`` as ``simulate`` would run them (prompts
    and outputs fitted to ``max_context`` the same way); None for a pipelined cost model or
    no requests."""
    if cost_model.pipeline_parallel > 1:
        return None
    specs, _, _ = fit_to_context(
        requests, num_blocks * block_size if max_context is None else max_context)
    if not specs:
        return None
    f = min(cost_model.decode_time(1), cost_model.prefill_time(1))
    a = _least_chord(cost_model.decode_time, max_batch_size)
    # A prompt chunk stays within the token budget; the largest prompt widens the range in
    # case one does not (a wider range can only lower the slope: still a bound).
    b = _least_chord(cost_model.prefill_time,
                     max(max_batched_tokens, max(s.input_tokens for s in specs)))
    decodes = sum(s.output_tokens - 1 for s in specs)
    held = sum(_blocks_up_to(s.input_tokens + s.output_tokens - 1, block_size)
               - _blocks_up_to(s.input_tokens, block_size) for s in specs)
    # A one-token prompt joins the batch as a decode (``core/batcher.py``): its token costs a
    # decode's slope or a prefill's, whichever is the less.
    prompt = sum(s.input_tokens for s in specs if s.input_tokens > 1)
    single = sum(1 for s in specs if s.input_tokens == 1) * min(a, b)
    by_batch, by_pool = decodes / max_batch_size, held / num_blocks
    iterations = max(by_batch, by_pool)
    if f >= a + b:
        least_s = iterations * (f - a - b) + a * decodes + b * prompt + single
    else:  # the sum falls with the iterations; each still takes f: the two bounds cross
        iterations = max(iterations, (a * decodes + b * prompt + single) / (a + b))
        least_s = iterations * f
    return RateBound(rate=replicas * len(specs) / least_s, least_s=least_s,
                     iterations=iterations, binds="pool" if by_pool > by_batch else "batch",
                     requests=len(specs))
