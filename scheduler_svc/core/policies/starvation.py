"""Starvation deadlines, shared by the policies that promote jobs which wait too long.

A job starves when it has not run for ``limit_s x scale x 2^(times promoted)`` since it last
ran (or arrived, or was promoted): the limit doubles per promotion, because under overload
every paused job starves, and a fixed limit turned the ranking into round robin over all of
them; ``scale`` (1 for the MLFQs) lets a policy give larger jobs a longer wait.

A running job is touched every iteration, and its deadline moves each time (earlier, too,
where ``scale`` shrinks as a job's predicted work does), so the heap of deadlines holds, per
job, one entry at or before its deadline rather than one per touch: a touch pushes only when
the job has no entry that early, and then the earliest deadline any touch from now on can give
(``limit_s x min(scale, 1) x 2^(times promoted)`` from now); an entry found before its job's
deadline goes back in at the deadline. Finding the starving jobs costs O(log n) per job per
``limit_s`` it runs, not per iteration; they come in (deadline, job id) order, as before.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Iterator

from scheduler_svc.core.job_id import JobId


class _Wait:
    """One job's starvation state: its deadline, its entry in the heap, its promotions."""

    def __init__(self) -> None:
        self.deadline = 0.0
        self.queued = 0.0  # its one entry in the heap (at most its deadline), if ``entered``
        self.entered = False
        self.backoff = 1.0  # 2 ^ times promoted, by which its limit is multiplied
        self.times_promoted = 0


class StarvationClock:
    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self._of: dict[int, _Wait] = {}  # per live job, one record: a lookup per touch
        self._waits: list[tuple[float, JobId]] = []

    def touch(self, jid: JobId, now: float, scale: float = 1.0) -> None:
        """The job ran (or arrived, or was promoted) at ``now``: its deadline starts over."""
        w = self._wait(jid)
        w.deadline = deadline = now + self.limit_s * scale * w.backoff
        if not w.entered or w.queued > deadline:
            # No touch from now on gives an earlier deadline.
            early = now + self.limit_s * min(scale, 1.0) * w.backoff
            w.queued, w.entered = early, True
            heapq.heappush(self._waits, (early, jid))

    def _wait(self, jid: JobId) -> _Wait:
        """The job's record, made on its first touch or promotion."""
        w = self._of.get(jid)
        if w is None:
            w = self._of[jid] = _Wait()
        return w

    def forget(self, jid: JobId) -> None:
        del self._of[jid]

    def promoted(self, jid: JobId) -> None:
        """Count a promotion: the job's next limit is twice this one."""
        w = self._wait(jid)
        w.times_promoted += 1
        w.backoff *= 2.0

    def deadline(self, jid: int) -> float:
        """When the job starves if it does not run (it must have been touched)."""
        return self._of[jid].deadline

    def times_promoted(self, jid: int) -> int:
        w = self._of.get(jid)
        return 0 if w is None else w.times_promoted

    def deadlines(self) -> dict[int, float]:
        """Every live job's deadline."""
        return {jid: w.deadline for jid, w in self._of.items()}

    def _settle(self, until: float) -> None:
        """Until the heap's first entry is a live job's deadline itself or not before
        ``until``: entries left behind (by an earlier entry, or a job gone) dropped, early
        ones moved to their deadline. Entries after ``until`` stay as they are: a running
        job's moves with every touch."""
        waits, of = self._waits, self._of
        while waits:
            at, jid = waits[0]
            if at > until:
                return
            w = of.get(jid)
            if w is None or not w.entered or w.queued != at:
                heapq.heappop(waits)  # the job gone, or superseded by an earlier entry
                continue
            due = w.deadline
            if due == at:
                return
            # early: the job ran since it was pushed
            w.queued = due
            heapq.heapreplace(waits, (due, jid))

    def starving(self, now: float) -> Iterator[JobId]:
        """The jobs whose deadline has passed by ``now``, each once per deadline (the caller
        promotes them, or not, and may ``touch`` them while iterating)."""
        waits = self._waits
        while True:
            self._settle(now)
            if not waits or not now > waits[0][0]:
                return
            _, jid = heapq.heappop(waits)
            self._of[jid].entered = False
            yield jid

    def next_deadline(self, until: float = float("inf")) -> float:
        """The earliest deadline of a live job where it is at most ``until``; otherwise a time
        after ``until`` (inf: no job): no job starves before it."""
        self._settle(until)
        return self._waits[0][0] if self._waits else float("inf")

    def none_starve(self, starts: list[float]) -> int:
        """How many of the Steps at ``starts`` (ascending) come before any job starves, by the
        deadlines as they are now (the batch's own are moved on at each of its touches)."""
        if not starts:
            return 0
        return bisect.bisect_right(starts, self.next_deadline(starts[-1]))

    def time_left(self, jid: int, now: float) -> float:
        return max(self._of[jid].deadline - now, 0.0)
