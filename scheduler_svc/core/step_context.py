"""What one ``schedule()`` call knows while it forms a plan: shared by the batcher and the KV
policies, built fresh for every Step and dropped after it."""

from __future__ import annotations

from collections.abc import Set
from dataclasses import dataclass

from scheduler_svc.core.contract import StepPlan
from scheduler_svc.core.job import Job
from scheduler_svc.core.policies import Policy


@dataclass(init=False)  # its __init__ written out: compiled (see contract.py)
class StepContext:
    now: float
    plan: StepPlan
    policy: Policy
    iteration_s: float  # the last iteration's compute time: ENST's unit
    batch_estimate: int  # jobs per iteration for ENST
    busy: Set[int]  # jobs in plans still in flight: not planned again
    max_batch: int  # jobs this plan may take (0: the configured max_batch_size)
    iterations: int  # iterations the group has run so far (fast-forwarded ones too)
    chosen: set[int]  # jobs in this plan's batch
    rank: dict[int, int]  # position in this Step's priority walk
    started: list[Job]  # jobs scheduled for the first time
    passed: int  # jobs the walk passed unread (``WalkSkip``): ranked, not batched
    # Whether the walk passed jobs only by need against free blocks (no Step displaces paused
    # KV: no drops, no store), so a run of decodes, which only uses up free blocks, passes
    # them again (``steady.repeatable``).
    passes_hold: bool
    _enst: dict[int, float] | None

    def __init__(self, now: float, plan: StepPlan, policy: Policy, iteration_s: float,
                 batch_estimate: int, busy: Set[int] = frozenset(), max_batch: int = 0,
                 iterations: int = 0):
        self.now = now
        self.plan = plan
        self.policy = policy
        self.iteration_s = iteration_s
        self.batch_estimate = batch_estimate
        self.busy = busy
        self.max_batch = max_batch
        self.iterations = iterations
        self.chosen = set()
        self.rank = {}
        self.started = []
        self.passed = 0
        self.passes_hold = False
        self._enst = None

    def enst(self) -> dict[int, float]:
        """Estimated Next Scheduled Time of every job that has run (the only ones that can
        hold KV, all the KV policies read), seconds from now (the policy's). Computed once
        per Step (read-only): nothing a Step's walk does changes it, and both the
        displacement of paused jobs and the proactive planner read it."""
        if self._enst is None:
            self._enst = self.policy.enst(self.now, self.batch_estimate, self.iteration_s,
                                          started_only=True)
        return self._enst
