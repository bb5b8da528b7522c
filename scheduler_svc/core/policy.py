"""Scheduling policies: the order in which live jobs get into a batch.

A policy only ranks jobs; the core turns the ranking into a batch under the batch-size, token
and KV-block budgets. Policies register by name, so a baseline is one small class.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import ClassVar

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job

POLICIES: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    POLICIES[cls.name] = cls
    return cls


def make_policy(config: SchedulerConfig, cost_model: CostModel | None = None) -> Policy:
    try:
        cls = POLICIES[config.policy]
    except KeyError:
        raise ValueError(
            f"scheduler policy must be one of {sorted(POLICIES)}, got {config.policy!r}"
        ) from None
    if cls.needs_cost_model and cost_model is None:
        raise ValueError(f"scheduler policy {config.policy!r} needs the worker's cost model")
    return cls(config, cost_model)


class Policy(ABC):
    """Ranks the live (admitted, unfinished) jobs of one worker group."""

    name: ClassVar[str]
    needs_cost_model: ClassVar[bool] = False
    # Whether a new arrival can rank ahead of jobs already started. Only then is it worth
    # keeping free KV blocks for arrivals (the proactive planner's headroom).
    arrivals_preempt: ClassVar[bool] = True

    def __init__(self, config: SchedulerConfig, cost_model: CostModel | None = None):
        self.config = config
        self.cost_model = cost_model
        self.num_demotions = 0
        self.num_promotions = 0

    @abstractmethod
    def add(self, job: Job, now: float) -> None:
        """A job was admitted."""

    @abstractmethod
    def remove(self, job: Job) -> None:
        """A job finished, was cancelled or failed."""

    @abstractmethod
    def order(self, now: float) -> Iterable[Job]:
        """Jobs that may run now, highest priority first.

        Consumed lazily: the core stops once the batch is full, so with thousands of queued
        jobs an iteration costs what its batch costs. The policy must not change while the
        iterator is being consumed (the core adds and removes jobs only outside schedule()).
        """

    def on_iteration(self, ran: list[Job], elapsed_s: float, now: float) -> None:
        """An iteration that ran ``ran`` took ``elapsed_s``: charge service, demote..."""

    def enst(self, now: float, batch_size: int, iteration_s: float) -> dict[int, float]:
        """Estimated Next Scheduled Time of every live job, in seconds from ``now``.

        The KV planner offloads the largest and uploads the smallest. This default reads it
        off the ranking: the jobs ahead of a job fill ``batch_size`` slots per iteration.
        """
        return {job.job_id: (i // batch_size) * iteration_s
                for i, job in enumerate(self.order(now))}

    @abstractmethod
    def queues(self) -> list[tuple[str, int]]:
        """Queue names and depths, for Status and metrics."""


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


# The other policies register themselves on import; importing them here makes the registry
# complete for anyone who imports this module.
from scheduler_svc.core import mlfq, priority  # noqa: F401
