"""The cluster layer: one job table over the worker groups, the choice of a group for each new
request, and what a lost group means for its jobs.

Each group is a ``WorkerLoop`` (one worker connection and its ``GroupCore``). The API talks
only to this layer: it never reads a loop's core. A new request goes to the ready group with
the least load (fewest live jobs, then the most free KV blocks); a lost group's jobs fail
(clients see UNAVAILABLE) — moving them to another group is the next step (``detach`` on the
core is its half).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler_svc.core.contract import JobUpdate, Stats
from scheduler_svc.core.job import Job, JobStatus
from scheduler_svc.loop import WorkerLoop


@dataclass(frozen=True)
class Limits:
    """What a request placed on a group must respect."""

    vocab_size: int
    max_context: int
    eos_token_ids: frozenset[int]


@dataclass(frozen=True)
class GroupStatus:
    address: str
    state: str
    ready: bool
    error: str
    model: str
    stats: Stats | None  # the loop's last published snapshot
    predictor: str = ""  # the worker's output-length predictor (Describe), empty: none


class Cluster:
    def __init__(self, loops: list[WorkerLoop]):
        self.loops = loops
        self._live: dict[str, tuple[Job, WorkerLoop]] = {}  # request id -> job, its group

    # ---- placement ----------------------------------------------------------------------
    def pick(self) -> WorkerLoop | None:
        """The ready group with the least load, or None when no group is ready."""
        ready = [(lp.load(), i) for i, lp in enumerate(self.loops) if lp.ready]
        return self.loops[min(ready)[1]] if ready else None

    @staticmethod
    def limits(group: WorkerLoop) -> Limits:
        d = group.describe
        assert d is not None and group.max_context is not None
        return Limits(d.vocab_size, group.max_context, frozenset(d.eos_token_ids))

    @staticmethod
    def can_admit(group: WorkerLoop) -> bool:
        return group.can_admit()

    # ---- the job table ------------------------------------------------------------------
    def is_live(self, request_id: str) -> bool:
        return request_id in self._live

    def submit(self, job: Job, group: WorkerLoop, sink: Callable[[JobUpdate], None]) -> None:
        self._live[job.request_id] = (job, group)
        group.submit(job, sink)

    def end(self, request_id: str, status: JobStatus) -> bool:
        """Finish a live request from outside (cancel, client gone, stop string)."""
        entry = self._live.get(request_id)
        if entry is None:
            return False
        job, group = entry
        group.end(job, status)
        return True

    def forget(self, request_id: str) -> None:
        """The request's stream is over: it leaves the table."""
        self._live.pop(request_id, None)

    def status(self) -> list[GroupStatus]:
        return [GroupStatus(lp.address, lp.state, lp.ready, lp.error,
                            lp.describe.model if lp.describe is not None else "", lp.stats,
                            lp.describe.predictor if lp.describe is not None else "")
                for lp in self.loops]

