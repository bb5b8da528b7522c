"""The cluster layer: one job table over the worker groups, the choice of a group for each new
request, and what a lost group means for its jobs.

Each group is a ``WorkerLoop`` (one worker connection and its ``GroupCore``). The API talks
only to this layer: it never reads a loop's core. A new request goes to the ready group with
the least load (fewest live jobs, then the most free KV blocks). A lost group's jobs are not
failed: each moves, with its prompt and the tokens already streamed, to the least-loaded
other ready group, which recomputes its KV (greedy output goes on token for token; a seeded
job draws what it would have drawn); with no other group ready they wait for one, the lost
one coming back included, for at most the ``worker_loss_wait_s`` setting, and only then fail
(clients see UNAVAILABLE). Its client sees a pause. The jobs' KV is recomputed, never
uploaded from the node's store (a restarted worker's store lease is a new one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

from scheduler_svc.core.contract import JobUpdate, Stats
from scheduler_svc.core.job import Job, JobStatus
from scheduler_svc.loop import WorkerLoop

log = logging.getLogger(__name__)

Sink = Callable[[JobUpdate], None]


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
    tensor_parallel_size: int = 1  # ranks of the worker group (Describe)
    pipeline_parallel_size: int = 1  # its pipeline stages (Describe)


class Cluster:
    def __init__(self, loops: list[WorkerLoop], orphan_timeout_s: float):
        """``orphan_timeout_s``: how long a lost group's jobs wait for a group to take them
        before they fail (SchedulerConfig.worker_loss_wait_s)."""
        self.loops = loops
        self.orphan_timeout_s = orphan_timeout_s
        # request id -> job, its group (None: its group was lost and none has taken it yet)
        self._live: dict[str, tuple[Job, WorkerLoop | None]] = {}
        # request id -> job, sink, since, why its worker was lost
        self._orphans: dict[str, tuple[Job, Sink, float, str]] = {}
        for lp in loops:
            lp.on_lost = self._rehome
            lp.on_ready = self._adopt

    # ---- membership (worker discovery) -------------------------------------------------
    def add_group(self, group: WorkerLoop) -> None:
        """A new group joins (discovery found a Ready worker): it connects and then serves."""
        if any(lp.address == group.address for lp in self.loops):
            return
        group.on_lost = self._rehome
        group.on_ready = self._adopt
        self.loops.append(group)
        group.start()

    async def remove_group(self, address: str, why: str) -> None:
        """The group at ``address`` leaves (its pod was deleted or is not Ready): its jobs
        move to the others, or wait for one, as for a lost group."""
        group = next((lp for lp in self.loops if lp.address == address), None)
        if group is None:
            return
        self.loops.remove(group)  # first: nothing new, and none of its own jobs, goes there
        await group.retire(why)

    # ---- placement ----------------------------------------------------------------------
    def pick(self, exclude: WorkerLoop | None = None) -> WorkerLoop | None:
        """The ready group with the least load, or None when no group is ready."""
        ready = [(lp.load(), i) for i, lp in enumerate(self.loops)
                 if lp.ready and lp is not exclude]
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
        if group is not None:
            group.end(job, status)
        elif (orphan := self._orphans.pop(request_id, None)) is not None:
            self._finish(job, orphan[1], status)
        return True

    def forget(self, request_id: str) -> None:
        """The request's stream is over: it leaves the table."""
        self._live.pop(request_id, None)
        self._orphans.pop(request_id, None)

    # ---- lost groups --------------------------------------------------------------------
    @property
    def num_orphaned(self) -> int:
        return len(self._orphans)

    def _rehome(self, lost: WorkerLoop, moved: list[tuple[Job, Sink]], why: str) -> None:
        """``lost``'s live jobs: each to another ready group, or to wait for one."""
        now = time.monotonic()
        placed = 0
        for job, sink in moved:
            if self._place(job, sink, exclude=lost):
                placed += 1
            else:
                self._orphans[job.request_id] = (job, sink, now,
                                                 f"worker {lost.address} unavailable: {why}")
                self._live[job.request_id] = (job, None)
        if moved:
            log.warning("worker %s lost (%s): %d jobs moved to other workers, %d wait for one "
                        "(at most %.0f s)", lost.address, why, placed, len(moved) - placed,
                        self.orphan_timeout_s)
        if self._orphans:
            asyncio.get_running_loop().call_later(self.orphan_timeout_s, self._expire)

    def _place(self, job: Job, sink: Sink, exclude: WorkerLoop | None = None) -> bool:
        group = self.pick(exclude)
        if group is None or group.max_context is None or job.num_tokens >= group.max_context:
            return False
        self._live[job.request_id] = (job, group)
        group.submit(job, sink)
        return True

    def _adopt(self, group: WorkerLoop) -> None:
        """A group became ready: the jobs waiting for one go to it (or to a better one)."""
        for rid, (job, sink, _, _) in list(self._orphans.items()):
            if self._place(job, sink):
                del self._orphans[rid]
        if not self._orphans:
            return
        log.info("worker %s ready; %d jobs still wait for a worker", group.address,
                 len(self._orphans))

    def _expire(self) -> None:
        now = time.monotonic()
        for rid, (job, sink, since, why) in list(self._orphans.items()):
            if now - since >= self.orphan_timeout_s - 1e-3:
                del self._orphans[rid]
                job.worker_lost = True
                self._finish(job, sink, JobStatus.FAILED,
                             f"{why}; no worker took the job within {self.orphan_timeout_s:g} s")

    @staticmethod
    def _finish(job: Job, sink: Sink, status: JobStatus, error: str = "") -> None:
        job.status = status
        job.finish_time = time.monotonic()
        job.error = error
        sink(JobUpdate(job, [], [], True))

    def status(self) -> list[GroupStatus]:
        return [GroupStatus(lp.address, lp.state, lp.ready, lp.error,
                            lp.describe.model if lp.describe is not None else "", lp.stats,
                            lp.describe.predictor if lp.describe is not None else "",
                            max(1, lp.describe.tensor_parallel_size)
                            if lp.describe is not None else 1,
                            max(1, lp.describe.pipeline_parallel_size)
                            if lp.describe is not None else 1)
                for lp in self.loops]

