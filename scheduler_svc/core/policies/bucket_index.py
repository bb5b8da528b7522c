"""Sums and minima over runs of a row of buckets, for a walk that passes whole runs at once.

``Fresh`` (``ranked.py``) keeps the jobs that have not run in buckets of about 64, each
knowing its smallest need and its size. A walk passing the buckets one by one, and a count of
the jobs before a key adding their sizes one by one, each cost a step per bucket: under
overload, with hundreds of thousands of jobs queued, that grew the cost of every Step with the
queue. This index answers both in O(log buckets): the first bucket of a run whose smallest need
is at most a floor, and the number of jobs in a run. It is a segment tree over the buckets,
changed in place when one bucket changes and rebuilt (O(buckets)) when one is inserted or
deleted, which ``Fresh`` does once per ``BUCKET`` jobs added or removed at most.
"""

from __future__ import annotations

# A need no bucket has: the padding past the last bucket (never inside a queried run).
_NONE = 1 << 62


class BucketIndex:
    def __init__(self) -> None:
        self.cap = 1  # leaves: a power of two, at least the number of buckets
        self.least: list[int] = [_NONE, _NONE]  # node -> smallest need below it
        self.size: list[int] = [0, 0]  # node -> jobs below it

    def rebuild(self, least: list[int], sizes: list[int]) -> None:
        """Index the buckets whose smallest needs and sizes are these, in order."""
        n = len(least)
        cap = 1
        while cap < n:
            cap *= 2
        lt = [_NONE] * (2 * cap)
        sz = [0] * (2 * cap)
        lt[cap:cap + n] = least
        sz[cap:cap + n] = sizes
        for i in range(cap - 1, 0, -1):
            a, b = lt[2 * i], lt[2 * i + 1]
            lt[i] = a if a < b else b
            sz[i] = sz[2 * i] + sz[2 * i + 1]
        self.cap, self.least, self.size = cap, lt, sz

    def set(self, i: int, least: int, size: int) -> None:
        """Bucket ``i`` now has this smallest need and this many jobs."""
        lt, sz = self.least, self.size
        i += self.cap
        lt[i], sz[i] = least, size
        i //= 2
        while i:
            a, b = lt[2 * i], lt[2 * i + 1]
            lt[i] = a if a < b else b
            sz[i] = sz[2 * i] + sz[2 * i + 1]
            i //= 2

    def total(self, lo: int, hi: int) -> int:
        """Jobs in buckets ``lo`` .. ``hi - 1``."""
        sz = self.size
        out = 0
        lo += self.cap
        hi += self.cap
        while lo < hi:
            if lo & 1:
                out += sz[lo]
                lo += 1
            if hi & 1:
                hi -= 1
                out += sz[hi]
            lo //= 2
            hi //= 2
        return out

    def first_at_most(self, lo: int, hi: int, floor: int) -> int:
        """The first bucket of ``lo`` .. ``hi - 1`` whose smallest need is at most ``floor``;
        ``hi`` when there is none."""
        lt, cap = self.least, self.cap
        left, right = lo + cap, hi + cap
        rights: list[int] = []  # the run's nodes on its right edge, right to left
        found = 0
        while left < right:
            if left & 1:
                if lt[left] <= floor:
                    found = left
                    break
                left += 1
            if right & 1:
                right -= 1
                rights.append(right)
            left //= 2
            right //= 2
        if not found:
            for node in reversed(rights):
                if lt[node] <= floor:
                    found = node
                    break
        if not found:
            return hi
        while found < cap:  # down to the leftmost leaf at most the floor
            found = 2 * found if lt[2 * found] <= floor else 2 * found + 1
        return found - cap
