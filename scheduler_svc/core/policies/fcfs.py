"""Arrival-order baselines: FCFS continuous batching (Orca / vLLM) and run-to-completion."""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterable

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job
from scheduler_svc.core.policies.base import Policy, register
from scheduler_svc.core.policies.ranked import NEVER


class FCFS(Policy):
    """Iteration-level continuous batching in arrival order (Orca / vLLM)."""

    name = "fcfs"
    arrivals_preempt = False

    def __init__(self, config: SchedulerConfig, cost_model: CostModel | None = None):
        super().__init__(config, cost_model)
        # Insertion order = arrival order. An OrderedDict, not a dict: a dict's iteration
        # skips the slots of deleted entries, and jobs finish from the front, so every walk
        # stepped over every job finished since the table last resized (the simulator's
        # cost per iteration grew with the run: 1M requests slowed from 2,400 to 1,000/s).
        self._jobs: OrderedDict[int, Job] = OrderedDict()

    def add(self, job: Job, now: float) -> None:
        self._jobs[job.job_id] = job

    def remove(self, job: Job) -> None:
        self._jobs.pop(job.job_id, None)

    def order(self, now: float) -> Iterable[Job]:
        return self._jobs.values()

    def steady_iterations(self, batch: list[Job], iteration_s: float,
                          starts: list[float], floor: int = NEVER) -> int:
        return len(starts)  # arrival order: nothing a decode changes

    def queues(self) -> list[tuple[str, int]]:
        return [("fcfs", len(self._jobs))]


class RunToCompletion(Policy):
    """Static batches (FasterTransformer): a batch is fixed until all its jobs end."""

    name = "rtc"
    arrivals_preempt = False

    def __init__(self, config: SchedulerConfig, cost_model: CostModel | None = None):
        super().__init__(config, cost_model)
        self._waiting: OrderedDict[int, Job] = OrderedDict()  # as FCFS's
        self._batch: dict[int, Job] = {}

    def add(self, job: Job, now: float) -> None:
        self._waiting[job.job_id] = job

    def remove(self, job: Job) -> None:
        self._waiting.pop(job.job_id, None)
        self._batch.pop(job.job_id, None)

    def order(self, now: float) -> list[Job]:
        if not self._batch:
            ids = list(itertools.islice(self._waiting, self.config.max_batch_size))
            self._batch = {i: self._waiting.pop(i) for i in ids}
        return list(self._batch.values())

    def steady_iterations(self, batch: list[Job], iteration_s: float,
                          starts: list[float], floor: int = NEVER) -> int:
        return len(starts)  # the batch is fixed until it empties

    def queues(self) -> list[tuple[str, int]]:
        return [("batch", len(self._batch)), ("waiting", len(self._waiting))]


register(FCFS)
register(RunToCompletion)
