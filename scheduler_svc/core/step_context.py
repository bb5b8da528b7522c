"""What one ``schedule()`` call knows while it forms a plan: shared by the batcher and the KV
policies, built fresh for every Step and dropped after it."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass, field

from scheduler_svc.core.contract import StepPlan
from scheduler_svc.core.job import Job
from scheduler_svc.core.policies import Policy


@dataclass
class StepContext:
    now: float
    plan: StepPlan
    policy: Policy
    iteration_s: float  # the last iteration's compute time: ENST's unit
    batch_estimate: int  # jobs per iteration for ENST
    busy: Set[int] = frozenset()  # jobs in plans still in flight: not planned again
    max_batch: int = 0  # jobs this plan may take (0: the configured max_batch_size)
    iterations: int = 0  # iterations the group has run so far (fast-forwarded ones too)
    chosen: set[int] = field(default_factory=set)  # jobs in this plan's batch
    rank: dict[int, int] = field(default_factory=dict)  # position in this Step's priority walk
    started: list[Job] = field(default_factory=list)  # jobs scheduled for the first time
    passed: int = 0  # jobs the walk passed unread (``WalkSkip``): ranked, not batched
    # Whether the walk passed jobs only by need against free blocks (no Step displaces paused
    # KV: no drops, no store), so a run of decodes, which only uses up free blocks, passes
    # them again (``steady.repeatable``).
    passes_hold: bool = False
    _enst: dict[int, float] | None = None

    def enst(self) -> dict[int, float]:
        """Estimated Next Scheduled Time of every job that has run (the only ones that can
        hold KV, all the KV policies read), seconds from now (the policy's). Computed once
        per Step (read-only): nothing a Step's walk does changes it, and both the
        displacement of paused jobs and the proactive planner read it."""
        if self._enst is None:
            self._enst = self.policy.enst(self.now, self.batch_estimate, self.iteration_s,
                                          started_only=True)
        return self._enst
