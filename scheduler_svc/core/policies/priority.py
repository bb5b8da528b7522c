"""Static-priority baselines: shortest prompt first, and an SRPT oracle for evaluation."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job
from scheduler_svc.core.policies.base import Policy, register


class _SortedPolicy(Policy):
    """Live jobs ranked by ``key(job)`` each iteration, ties by arrival."""

    def __init__(self, config: SchedulerConfig, cost_model: CostModel | None = None):
        super().__init__(config, cost_model)
        self._jobs: dict[int, Job] = {}

    def key(self, job: Job) -> float:
        raise NotImplementedError

    def add(self, job: Job, now: float) -> None:
        self._jobs[job.job_id] = job

    def remove(self, job: Job) -> None:
        self._jobs.pop(job.job_id, None)

    def order(self, now: float) -> Iterable[Job]:
        return sorted(self._jobs.values(), key=lambda j: (self.key(j), j.job_id))

    def queues(self) -> list[tuple[str, int]]:
        return [(self.name, len(self._jobs))]


class ShortestPromptFirst(_SortedPolicy):
    """Fixed priority by input length: the shortest prompt runs first."""

    name = "fixed-priority"

    def key(self, job: Job) -> float:
        return len(job.prompt)

    def steady_iterations(self, batch: list[Job], iteration_s: float,
                          starts: list[float]) -> int:
        return len(starts)  # a static key


class SRPTOracle(_SortedPolicy):
    """Shortest remaining output first, told the true output length: the client's
    ``output_length_hint`` (a benchmark that measured each answer in an earlier run) or else
    ``max_tokens`` (trace replay, where every request runs to exactly its length). A bound
    for evaluation, not a deployable policy."""

    name = "srpt-oracle"

    def key(self, job: Job) -> float:
        total = job.output_length_hint or job.max_tokens
        return max(total - len(job.output), 0) + job.num_pending / 1e6

    def steady_iterations(self, batch: list[Job], iteration_s: float,
                          starts: list[float]) -> int:
        # A decode only lowers its job's key: the batch stays ahead of every other job (its
        # own order may change, which moves no job in or out).
        return len(starts)


register(ShortestPromptFirst)
register(SRPTOracle)
