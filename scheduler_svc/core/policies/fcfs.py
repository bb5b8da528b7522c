"""Arrival-order baselines: FCFS continuous batching (Orca / vLLM) and run-to-completion."""

from __future__ import annotations

from collections.abc import Iterable

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job
from scheduler_svc.core.policies.base import Policy, register


@register
class FCFS(Policy):
    """Iteration-level continuous batching in arrival order (Orca / vLLM)."""

    name = "fcfs"
    arrivals_preempt = False

    def __init__(self, config: SchedulerConfig, cost_model: CostModel | None = None):
        super().__init__(config, cost_model)
        self._jobs: dict[int, Job] = {}  # insertion order = arrival order

    def add(self, job: Job, now: float) -> None:
        self._jobs[job.job_id] = job

    def remove(self, job: Job) -> None:
        self._jobs.pop(job.job_id, None)

    def order(self, now: float) -> Iterable[Job]:
        return self._jobs.values()

    def queues(self) -> list[tuple[str, int]]:
        return [("fcfs", len(self._jobs))]


@register
class RunToCompletion(Policy):
    """Static batches (FasterTransformer): a batch is fixed until all its jobs end."""

    name = "rtc"
    arrivals_preempt = False

    def __init__(self, config: SchedulerConfig, cost_model: CostModel | None = None):
        super().__init__(config, cost_model)
        self._waiting: dict[int, Job] = {}
        self._batch: dict[int, Job] = {}

    def add(self, job: Job, now: float) -> None:
        self._waiting[job.job_id] = job

    def remove(self, job: Job) -> None:
        self._waiting.pop(job.job_id, None)
        self._batch.pop(job.job_id, None)

    def order(self, now: float) -> list[Job]:
        if not self._batch:
            ids = list(self._waiting)[: self.config.max_batch_size]
            self._batch = {i: self._waiting.pop(i) for i in ids}
        return list(self._batch.values())

    def queues(self) -> list[tuple[str, int]]:
        return [("batch", len(self._batch)), ("waiting", len(self._waiting))]
