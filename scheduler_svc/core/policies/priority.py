"""Static-priority baselines: shortest prompt first, and an SRPT oracle for evaluation."""

from __future__ import annotations

import math
from collections.abc import Iterable

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job
from scheduler_svc.core.policies.base import Policy, enst_by_place, register
from scheduler_svc.core.policies.rank_key import Key, RankKey
from scheduler_svc.core.policies.ranked import NEVER, Ranked, WalkSkip


class _SortedPolicy(Policy):
    """Live jobs ranked by ``key(job)``, ties by arrival (job id). A key must not change
    while a job has not run (see ``Ranked``)."""

    passes_new_jobs = True
    # No job's key ever moves (not even a started job's): see ``Ranked``.
    static_keys = False

    def __init__(self, config: SchedulerConfig, cost_model: CostModel | None = None):
        super().__init__(config, cost_model)
        self._ranked = Ranked(_Key(self), static=self.static_keys)

    def key(self, job: Job) -> float:
        raise NotImplementedError

    def _full_key(self, job: Job) -> Key:
        return (self.key(job), job.job_id, 0)

    def add(self, job: Job, now: float) -> None:
        self._ranked.add(job)

    def remove(self, job: Job) -> None:
        self._ranked.remove(job.job_id)

    def order(self, now: float) -> Iterable[Job]:
        return self.walk(now, None)

    def walk(self, now: float, skip: WalkSkip | None) -> Iterable[Job]:
        self._ranked.settle()
        return self._ranked.walk(skip)

    def on_start(self, job: Job) -> None:
        self._ranked.start(job)

    def enst(self, now: float, batch_size: int, iteration_s: float,
             started_only: bool = False) -> dict[int, float]:
        if not started_only:
            return super().enst(now, batch_size, iteration_s)
        return enst_by_place(self._ranked.positions(0), batch_size, iteration_s)

    def queues(self) -> list[tuple[str, int]]:
        return [(self.name, len(self._ranked))]


class ShortestPromptFirst(_SortedPolicy):
    """Fixed priority by input length: the shortest prompt runs first, aged by arrival.

    With ``priority_aging_s`` = A > 0 the key is ``log2(prompt tokens) + arrival / A``: a job
    that arrives t seconds after another goes ahead of it only with a prompt under
    ``2^-(t / A)`` times as long. The key is still fixed when the job arrives (so the walk
    passes queued jobs as before), but a long prompt no longer waits behind every shorter one
    that comes after it: under overload, pure shortest-prompt-first left the longest prompts
    for a finite trace's last drain, few to a batch (0.93-0.94x FCFS's tokens/s on ShareGPT
    lengths at 1.5x and 3x capacity). A = 0 is pure shortest prompt first."""

    name = "fixed-priority"
    static_keys = True  # the prompt's length and the arrival time

    def __init__(self, config: SchedulerConfig, cost_model: CostModel | None = None):
        super().__init__(config, cost_model)
        self._aging_s = config.priority_aging_s

    def key(self, job: Job) -> float:
        if not self._aging_s:
            return len(job.prompt)
        return math.log2(max(len(job.prompt), 1)) + job.arrival_time / self._aging_s

    def steady_iterations(self, batch: list[Job], iteration_s: float,
                          starts: list[float], floor: int = NEVER) -> int:
        return len(starts)  # a static key


class SRPTOracle(_SortedPolicy):
    """Shortest remaining output first, told the true output length: the client's
    ``output_length_hint`` (a benchmark that measured each answer in an earlier run) or else
    ``max_tokens`` (trace replay, where every request runs to exactly its length). A bound
    for evaluation, not a deployable policy."""

    name = "srpt-oracle"

    def remaining_work(self, job: Job) -> float | None:
        return self.key(job)

    def key(self, job: Job) -> float:
        total = job.output_length_hint or job.max_tokens
        return max(total - len(job.output), 0) + job.num_pending / 1e6

    def steady_iterations(self, batch: list[Job], iteration_s: float,
                          starts: list[float], floor: int = NEVER) -> int:
        # A decode only lowers its job's key: the batch stays ahead of every other job the
        # walk reads (its own order may change, which moves no job in or out).
        return len(starts)


class _Key(RankKey):
    def __init__(self, policy: _SortedPolicy):
        self.policy = policy

    def of(self, job: Job) -> Key:
        return self.policy._full_key(job)


register(ShortestPromptFirst)
register(SRPTOracle)
