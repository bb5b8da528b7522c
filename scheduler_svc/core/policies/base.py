"""The scheduling policy interface and its registry.

A policy only ranks jobs; the batcher turns the ranking into a batch under the batch-size,
token and KV-block budgets. Policies register by name (``@register``), one file per family in
this package, so a new policy is one new file and touches no existing one.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import ClassVar

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job
from scheduler_svc.core.policies.ranked import NEVER, WalkSkip

POLICIES: dict[str, type[Policy]] = {}


def register(cls: type[Policy]) -> type[Policy]:
    """Make ``cls`` selectable by its name. Called after the class, not as its decorator: mypyc
    (``scheduler_svc/compiled.py``) compiles a decorated class as a plain Python class, which
    may not inherit from the compiled ``Policy``."""
    POLICIES[cls.name] = cls
    return cls


def enst_by_place(places: dict[int, int], batch_size: int,
                  iteration_s: float) -> dict[int, float]:
    """ENST of jobs at these places in the ranking: the jobs ahead of one fill
    ``batch_size`` slots per iteration."""
    return {jid: (i // batch_size) * iteration_s for jid, i in places.items()}


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
    # Whether ``walk`` may pass new jobs that cannot run (``WalkSkip``): the batcher then
    # tells it where the walk stands before each job it asks for.
    passes_new_jobs: ClassVar[bool] = False

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

    def walk(self, now: float, skip: WalkSkip | None) -> Iterable[Job]:
        """``order(now)``, for the batcher's walk: a policy that can tell which of its jobs
        ``skip`` lets pass may leave them out (counted in ``skip.passed``); this default
        leaves out none."""
        return self.order(now)

    def remaining_work(self, job: Job) -> float | None:
        """The work left to ``job`` that this policy ranks by, fewest first (SRPT), or None
        for a policy whose rank is not the job's work. Only then may a new job ranked ahead
        take the blocks of started jobs that would run (``displace_running_ratio``): under an
        MLFQ every arrival ranks first, and taking the running batch's blocks for each is
        churn."""
        return None

    def on_start(self, job: Job) -> None:  # noqa: B027 - a default hook
        """``job`` was planned for the first time, in the Step being formed (its prefill
        begins). Called during the walk: the order being walked must not change."""

    # Whether the policy ranks by predicted output lengths: only then does the core ask the
    # worker for estimates at arrival (``SchedulerConfig.arrival_probe_tokens``).
    ranks_by_prediction: ClassVar[bool] = False

    def on_estimate(self, job: Job, now: float) -> None:  # noqa: B027 - a default hook
        """A job that has not started got its first predicted length (an estimate at
        arrival): a policy that ranks by it re-ranks the job. Called outside ``schedule()``."""

    def on_iteration(self, ran: list[Job], elapsed_s: float,  # noqa: B027 - a default hook
                     now: float) -> None:
        """An iteration that ran ``ran`` took ``elapsed_s``: charge service, demote..."""

    def steady_iterations(self, batch: list[Job], iteration_s: float,
                          starts: list[float], floor: int = NEVER) -> int:
        """Of the next ``len(starts)`` iterations (starting at ``starts``, each
        ``iteration_s`` long, each running ``batch`` for one decode per job), how many in a
        row this policy would rank ``batch`` first, in the same order, when each is scheduled:
        the simulator applies that many at once (``core/steady.py``). 0, the default, when
        the policy cannot tell. Jobs that have not run and need more than ``floor`` tokens
        (``WalkSkip``) are passed by every walk of those iterations: they may rank anywhere,
        and more such jobs may arrive among them (any other arrival ends the run first).
        ``NEVER``: no job is passed, and nothing arrives."""
        return 0

    def batch_order(self, batch: list[Job], floor: int, full: bool) -> list[Job] | None:
        """The policy moved jobs (demoted, promoted) since ``batch`` was planned: its jobs in
        the order the next walk would read them, where it would read them first (every other
        job it would read ranks after the last of them, or none at all unless the batch is
        ``full``; jobs that have not run and need more than ``floor`` are passed); None where
        it would not, or the policy cannot tell (then the plan does not repeat)."""
        return None

    def starves_after_s(self) -> float:
        """The least time a job that arrives now waits before this policy promotes it for
        starving (inf: it never does): a run of iterations that admits arrivals ends by then
        (``core/steady.py``)."""
        return float("inf")

    def enst(self, now: float, batch_size: int, iteration_s: float,
             started_only: bool = False) -> dict[int, float]:
        """Estimated Next Scheduled Time of every live job (``started_only``: of every job
        that has run, the only ones that can hold KV), in seconds from ``now``.

        The KV planner offloads the largest and uploads the smallest. This default reads it
        off the ranking: the jobs ahead of a job fill ``batch_size`` slots per iteration.
        """
        return enst_by_place({job.job_id: i for i, job in enumerate(self.order(now))
                              if not started_only or job.first_scheduled_time is not None},
                             batch_size, iteration_s)

    @abstractmethod
    def queues(self) -> list[tuple[str, int]]:
        """Queue names and depths, for Status and metrics."""
