"""Starvation deadlines, shared by the policies that promote jobs which wait too long.

A job starves when it has not run for ``limit_s x scale x 2^(times promoted)`` since it last
ran (or arrived, or was promoted): the limit doubles per promotion, because under overload
every paused job starves, and a fixed limit turned the ranking into round robin over all of
them; ``scale`` (1 for the MLFQs) lets a policy give larger jobs a longer wait.
(deadline, job id) is pushed at every ``touch``; stale entries are skipped, so finding the
starving jobs costs O(log n) per job touched, not a scan of every job.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterator


class StarvationClock:
    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.deadline: dict[int, float] = {}
        self.times_promoted: dict[int, int] = {}
        self._waits: list[tuple[float, int]] = []

    def touch(self, jid: int, now: float, scale: float = 1.0) -> None:
        """The job ran (or arrived, or was promoted) at ``now``: its deadline starts over."""
        limit = self.limit_s * scale * 2 ** self.times_promoted.get(jid, 0)
        self.deadline[jid] = deadline = now + limit
        heapq.heappush(self._waits, (deadline, jid))

    def forget(self, jid: int) -> None:
        del self.deadline[jid]
        self.times_promoted.pop(jid, None)

    def promoted(self, jid: int) -> None:
        """Count a promotion: the job's next limit is twice this one."""
        self.times_promoted[jid] = self.times_promoted.get(jid, 0) + 1

    def starving(self, now: float) -> Iterator[int]:
        """The jobs whose deadline has passed by ``now``, each once per deadline (the caller
        promotes them, or not, and may ``touch`` them while iterating)."""
        waits = self._waits
        while waits and now > waits[0][0]:
            deadline, jid = heapq.heappop(waits)
            if self.deadline.get(jid) == deadline:  # else it ran since, or it is gone
                yield jid

    def next_deadline(self) -> float:
        """The earliest deadline of a live job (inf: none): no job starves before it."""
        waits, deadline = self._waits, self.deadline
        while waits and deadline.get(waits[0][1]) != waits[0][0]:
            heapq.heappop(waits)  # stale: it ran since, or it is gone
        return waits[0][0] if waits else float("inf")

    def time_left(self, jid: int, now: float) -> float:
        return max(self.deadline[jid] - now, 0.0)
