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


class StarvationClock:
    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.deadline: dict[int, float] = {}
        self.times_promoted: dict[int, int] = {}
        self._waits: list[tuple[float, int]] = []
        self._queued: dict[int, float] = {}  # each job's one entry in _waits: at most its deadline

    def touch(self, jid: int, now: float, scale: float = 1.0) -> None:
        """The job ran (or arrived, or was promoted) at ``now``: its deadline starts over."""
        backoff = 2 ** self.times_promoted.get(jid, 0)
        self.deadline[jid] = deadline = now + self.limit_s * scale * backoff
        queued = self._queued.get(jid)
        if queued is None or queued > deadline:
            # No touch from now on gives an earlier deadline.
            early = now + self.limit_s * min(scale, 1.0) * backoff
            self._queued[jid] = early
            heapq.heappush(self._waits, (early, jid))

    def forget(self, jid: int) -> None:
        del self.deadline[jid]
        self.times_promoted.pop(jid, None)

    def promoted(self, jid: int) -> None:
        """Count a promotion: the job's next limit is twice this one."""
        self.times_promoted[jid] = self.times_promoted.get(jid, 0) + 1

    def _settle(self, until: float) -> None:
        """Until the heap's first entry is a live job's deadline itself or not before
        ``until``: entries left behind (by an earlier entry, or a job gone) dropped, early
        ones moved to their deadline. Entries after ``until`` stay as they are: a running
        job's moves with every touch."""
        waits, queued, deadline = self._waits, self._queued, self.deadline
        while waits:
            at, jid = waits[0]
            if at > until:
                return
            if queued.get(jid) != at:
                heapq.heappop(waits)  # superseded by an earlier entry of the job
                continue
            due = deadline.get(jid)
            if due == at:
                return
            if due is None:  # gone
                del queued[jid]
                heapq.heappop(waits)
            else:  # early: the job ran since it was pushed
                queued[jid] = due
                heapq.heapreplace(waits, (due, jid))

    def starving(self, now: float) -> Iterator[int]:
        """The jobs whose deadline has passed by ``now``, each once per deadline (the caller
        promotes them, or not, and may ``touch`` them while iterating)."""
        waits = self._waits
        while True:
            self._settle(now)
            if not waits or not now > waits[0][0]:
                return
            _, jid = heapq.heappop(waits)
            del self._queued[jid]
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
        return max(self.deadline[jid] - now, 0.0)
