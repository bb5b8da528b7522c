"""Live jobs in a policy's key order, kept between iterations, for the walk to pass over
the ones that cannot run without reading them.

A policy that ranks every job by a key (``predictive``, ``srpt-oracle``, ``fixed-priority``;
the MLFQs, whose key is a job's place in its queue) used to sort or chain all its live jobs
every iteration, and the batcher's walk then read each one that ranked above a job it could
run. Under overload most live jobs have never run, and their keys do not change until they
do: they are kept here in key order, in buckets that know their smallest ``need`` (tokens of
the prompt plus one, what a job that has not run needs blocks for), so the walk passes a
whole bucket of jobs that cannot fit at one comparison, and the jobs of a bucket before the
next started job at one bisection (``WalkSkip``). The jobs that have run (their keys move as
they make tokens) are keyed again before each walk and sorted from their last order; there
are as many of them as the device and the store can hold.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable
from operator import itemgetter

from scheduler_svc.core.job import Job
from scheduler_svc.core.job_id import JobId
from scheduler_svc.core.policies.bucket_index import BucketIndex
from scheduler_svc.core.policies.rank_key import Key, KeyCall, RankKey

# Jobs per bucket: a bucket splits at twice this. Small enough that an insertion or a
# removal (a list shift) is cheap, large enough that passing the buckets of a long queue is.
BUCKET = 64

# The ``need`` of a job the walk never passes (a one-token prompt: it joins as a decode).
ALWAYS = -(1 << 62)
# A ``floor`` no job's need exceeds: the walk passes none.
NEVER = 1 << 62


class WalkSkip:
    """What the batcher's walk tells the policy while it walks (the contract between them):
    a job that has not run, holds no claim on blocks (``claimed``) and needs more than
    ``floor`` tokens can neither start nor make room now, so handing it to the walk would
    change nothing; the policy passes it, and ``passed`` counts such jobs. The batcher sets
    ``floor`` before it asks for each next job (the walk's state at that moment; nothing the
    policy passes changes it)."""

    def __init__(self, claimed: set[int]):
        self.floor = NEVER
        self.claimed = claimed
        self.passed = 0


def need(job: Job) -> int:
    """What a job that has not run needs blocks for, in tokens (see ``ALWAYS``)."""
    return prompt_need(len(job.prompt))


def prompt_need(prompt_tokens: int) -> int:
    """``need`` of a job with a prompt this long."""
    return prompt_tokens + 1 if prompt_tokens > 1 else ALWAYS


class Fresh:
    """Jobs that have not run, in key order, in buckets (keys, jobs, needs, each bucket's
    smallest need and largest key)."""

    def __init__(self) -> None:
        self.keys: list[list[Key]] = []
        self.jobs: list[list[Job]] = []
        self.needs: list[list[int]] = []
        self.least: list[int] = []
        self.last: list[Key] = []
        self.key_of: dict[int, Key] = {}
        # Runs of buckets passed or counted at once (``bucket_index.py``); rebuilt before its
        # next use once a bucket has been inserted or deleted.
        self.index = BucketIndex()
        self._stale = False

    def __len__(self) -> int:
        return len(self.key_of)

    def add(self, job: Job, key: Key) -> None:
        self.key_of[job.job_id] = key
        n = need(job)
        if not self.keys:
            self.keys.append([key])
            self.jobs.append([job])
            self.needs.append([n])
            self.least.append(n)
            self.last.append(key)
            self._stale = True
            return
        i = min(bisect_left(self.last, key), len(self.keys) - 1)
        keys, jobs, needs = self.keys[i], self.jobs[i], self.needs[i]
        p = bisect_left(keys, key)
        keys.insert(p, key)
        jobs.insert(p, job)
        needs.insert(p, n)
        self.least[i] = min(self.least[i], n)
        self.last[i] = keys[-1]
        if len(keys) > 2 * BUCKET:
            self.keys[i + 1:i + 1] = [keys[BUCKET:]]
            self.jobs[i + 1:i + 1] = [jobs[BUCKET:]]
            self.needs[i + 1:i + 1] = [needs[BUCKET:]]
            del keys[BUCKET:], jobs[BUCKET:], needs[BUCKET:]
            self.least[i:i + 1] = [min(needs), min(self.needs[i + 1])]
            self.last[i:i + 1] = [keys[-1], self.keys[i + 1][-1]]
            self._stale = True
        elif not self._stale:
            self.index.set(i, self.least[i], len(keys))

    def remove(self, job_id: JobId) -> bool:
        """Take the job out; whether it was here."""
        key = self.key_of.get(job_id)
        if key is None:
            return False
        del self.key_of[job_id]
        i = bisect_left(self.last, key)
        keys = self.keys[i]
        p = bisect_left(keys, key)
        del keys[p]
        del self.jobs[i][p]
        n = self.needs[i].pop(p)
        if not keys:
            del self.keys[i], self.jobs[i], self.needs[i], self.least[i], self.last[i]
            self._stale = True
            return True
        self.last[i] = keys[-1]
        if n == self.least[i]:
            self.least[i] = min(self.needs[i])
        if not self._stale:
            self.index.set(i, self.least[i], len(keys))
        return True

    def _indexed(self) -> BucketIndex:
        """The index, rebuilt first if a bucket was inserted or deleted since it was built."""
        if self._stale:
            self.index.rebuild(self.least, [len(k) for k in self.keys])
            self._stale = False
        return self.index

    def first_key_at_most(self, floor: int) -> Key | None:
        """The key of the first job here (in key order) whose need is at most ``floor``:
        the first one a walk with that floor would not pass; None when there is none."""
        nb = len(self.keys)
        b = self._indexed().first_at_most(0, nb, floor)
        if b == nb:
            return None
        for p, n in enumerate(self.needs[b]):
            if n <= floor:
                return self.keys[b][p]
        return None  # not reached: the bucket's smallest need is at most the floor

    def count_below(self, keys_sorted: list[Key]) -> list[int]:
        """For each key of ``keys_sorted`` (ascending), how many jobs here rank before it:
        the jobs of the buckets before the one it falls in, counted by the index."""
        out: list[int] = []
        last, nb = self.last, len(self.last)
        index = self._indexed()
        i, before = 0, 0
        for key in keys_sorted:
            j = bisect_left(last, key, i)
            if j > i:
                before += index.total(i, j)
                i = j
            out.append(before + (bisect_left(self.keys[i], key) if i < nb else 0))
        return out

    def walk(self, ran: list[tuple[Key, Job]], skip: WalkSkip | None) -> FreshWalk:
        """These jobs and the ``ran`` ones (sorted by key) in key order, the ones ``skip``
        lets pass left out."""
        return FreshWalk(self, ran, skip)


class FreshWalk:
    """``Fresh.walk``: an iterator over a ``Fresh`` merged with the started jobs, its place
    (bucket, place in it, started jobs handed out) kept in fields from one job to the next.
    The jobs must not change while it is read."""

    def __init__(self, fresh: Fresh, ran: list[tuple[Key, Job]], skip: WalkSkip | None):
        self.fresh = fresh
        self.ran = ran
        self.skip = skip
        self.claimed: set[int] = skip.claimed if skip is not None else set()
        key_of = fresh.key_of
        self.guards = sorted(key_of[j] for j in self.claimed if j in key_of)
        self.index: BucketIndex | None = fresh._indexed() if skip is not None else None
        self.b = 0  # bucket
        self.p = 0  # place in it
        self.r = 0  # started jobs handed out

    def __iter__(self) -> FreshWalk:
        return self

    def __next__(self) -> Job:
        job = self.next_job()
        if job is None:
            raise StopIteration
        return job

    def next_job(self) -> Job | None:
        """The next job, or None at the end."""
        fresh, ran, r = self.fresh, self.ran, self.r
        keys, jobs, needs, least, last = (fresh.keys, fresh.jobs, fresh.needs, fresh.least,
                                          fresh.last)
        skip, index, claimed, guards = self.skip, self.index, self.claimed, self.guards
        nb = len(keys)
        b, p = self.b, self.p
        head: Key | None = ran[r][0] if r < len(ran) else None
        while b < nb:
            bucket = keys[b]
            if p >= len(bucket):
                b, p = b + 1, 0
                continue
            if head is not None and head < bucket[p]:
                break
            if skip is None or index is None:
                self.b, self.p = b, p + 1
                return jobs[b][p]
            floor = skip.floor
            if (least[b] > floor and (head is None or last[b] < head)
                    and not _guarded(guards, bucket[p], last[b])):
                skip.passed += len(bucket) - p
                b, p = b + 1, 0
                # The buckets after it that pass as a whole, at once: up to the first with a
                # need under the floor, the first ending at or after the next started job,
                # or the first holding a claimed job's key.
                end = nb if head is None else bisect_left(last, head, b)
                g = bisect_left(guards, keys[b][0]) if b < end else len(guards)
                if g < len(guards):
                    end = min(end, bisect_left(last, guards[g], b))
                end = index.first_at_most(b, end, floor)
                if end > b:
                    skip.passed += index.total(b, end)
                    b = end
                continue
            # Within the bucket, up to the next started job (or the bucket's end): pass the
            # jobs that need more than the floor and hold no claim, one bisection and a scan
            # of needs instead of a key comparison each (120 such jobs a walk under
            # ``srpt-oracle`` at 2x capacity: its started jobs rank among the short ones).
            stop = (len(bucket) if head is None or last[b] < head
                    else bisect_right(bucket, head, p))
            bneeds, q = needs[b], p
            if claimed:
                bjobs = jobs[b]
                while q < stop and bneeds[q] > floor and bjobs[q].job_id not in claimed:
                    q += 1
            else:
                while q < stop and bneeds[q] > floor:
                    q += 1
            skip.passed += q - p
            p = q
            if q < stop:
                self.b, self.p = b, p + 1
                return jobs[b][p]
        self.b, self.p = b, p
        if head is not None:
            self.r = r + 1
            return ran[r][1]
        return None


def _guarded(guards: list[Key], lo: Key, hi: Key) -> bool:
    """Whether a claimed job's key lies in [lo, hi]."""
    i = bisect_left(guards, lo)
    return i < len(guards) and guards[i] <= hi


class Ranked:
    """A policy's live jobs by ``key``: the ones that have not run in ``Fresh`` (their keys
    fixed), the rest sorted per Step. ``key`` must stay what it was for a job that has not
    run until its ``start`` (a policy re-adds a job whose key it changes); the policy calls
    ``settle`` before each walk and whenever keys of started jobs may have moved since.
    ``static``: no job's key ever moves (``fixed-priority``), so the started jobs stay sorted
    from one Step to the next, each one placed as it starts, instead of sorted per walk.
    ``key`` is a ``RankKey`` (or any callable, wrapped in one)."""

    def __init__(self, key: RankKey | Callable[[Job], Key], static: bool = False):
        self.key = key if isinstance(key, RankKey) else KeyCall(key)
        self.static = static
        self.fresh = Fresh()
        self.ran: dict[int, Job] = {}
        # Started in the Step being formed, still in ``fresh`` (a walk may be reading it)
        # with the key they had: moved to ``ran`` by ``settle``.
        self.starting: dict[int, Job] = {}
        # ``ran`` sorted by key (None: to be sorted), kept from walk to walk. Keys of started
        # jobs move between Steps, never during one: after a ``settle`` (``_moved``), the next
        # walk keys them again in their last order and sorts that, which costs a pass where
        # few moved (a Step moves only its own batch's keys). Static keys: never keyed again.
        self._ran_sorted: list[tuple[Key, Job]] | None = None
        self._moved = False

    def __len__(self) -> int:
        return len(self.fresh) + len(self.ran)

    def __contains__(self, job_id: int) -> bool:
        return job_id in self.ran or job_id in self.fresh.key_of

    def add(self, job: Job) -> None:
        if job.started:
            if job.job_id in self.ran:
                self.remove(job.job_id)  # added again: placed anew
            self.ran[job.job_id] = job
            self._placed(job)
        else:
            self.fresh.add(job, self._key(job))

    def remove(self, job_id: JobId) -> bool:
        """Take the job out; whether it was here (a lookup or two where it was not: the
        predictive policy asks for every job of every batch)."""
        if job_id in self.starting:
            del self.starting[job_id]
        job = self.ran.get(job_id)
        if job is not None:
            del self.ran[job_id]
            ran = self._ran_sorted
            if ran is None:
                return True
            if self.static:
                i = bisect_left(ran, self._key(job), key=_first)
                assert ran[i][1] is job, "a static key moved"
                del ran[i]
            else:
                for i, (_, j) in enumerate(ran):
                    if j is job:
                        del ran[i]
                        break
            return True
        return self.fresh.remove(job_id)

    def _placed(self, job: Job) -> None:
        """``job`` joined ``ran``: in its place in the sorted started jobs (static keys), or
        at their end, sorted into place before the next walk."""
        ran = self._ran_sorted
        if ran is None:
            return
        key = self._key(job)
        if self.static:
            ran.insert(bisect_left(ran, key, key=_first), (key, job))
        else:
            ran.append((key, job))
            self._moved = True

    def start(self, job: Job) -> None:
        """``job`` was planned for the first time (its key may move from the next Step on)."""
        if job.job_id in self.fresh.key_of:
            self.starting[job.job_id] = job

    def settle(self) -> None:
        """Move the jobs started in the last Step out of ``fresh``: before a walk and when a
        Step's results come (keys of started jobs move then), never during a walk."""
        if not self.static:
            self._moved = True
        if self.starting:
            for jid, job in self.starting.items():
                self.fresh.remove(job.job_id)
                self.ran[jid] = job
                self._placed(job)
            self.starting.clear()

    def _key(self, job: Job) -> Key:
        return self.key.of(job)

    def _keyed(self, jobs: Iterable[Job]) -> list[tuple[Key, Job]]:
        key = self.key
        return [(key.of(j), j) for j in jobs]

    def _sorted(self, jobs: Iterable[Job]) -> list[tuple[Key, Job]]:
        return sorted(self._keyed(jobs), key=_first)

    def _ran_in_order(self) -> list[tuple[Key, Job]]:
        ran = self._ran_sorted
        if ran is None:
            ran = self._ran_sorted = self._sorted(self.ran.values())
        elif self._moved and ran:
            ran[:] = self._keyed([j for _, j in ran])
            ran.sort(key=_first)
        self._moved = False
        return ran

    def walk(self, skip: WalkSkip | None) -> FreshWalk:
        """Every job, in key order (``skip``: see ``WalkSkip``); ``settle`` first."""
        return self.fresh.walk(self._ran_in_order(), skip)

    def places(self) -> list[tuple[int, Job]]:
        """Every job that has run or is starting (those are still counted in ``fresh``)
        with its place in the key order, in that order."""
        starting = self.starting
        jobs = (self._sorted([*self.ran.values(), *starting.values()]) if starting
                else self._ran_in_order())
        below = self.fresh.count_below([k for k, _ in jobs])
        out: list[tuple[int, Job]] = []
        early = 0  # starting jobs ranked before this one (counted in ``below`` too)
        for i, ((_, j), n) in enumerate(zip(jobs, below)):
            out.append((i + n - early, j))
            early += j.job_id in starting
        return out

    def least_key(self, leave_out: set[int], floor: int = NEVER) -> Key | None:
        """The smallest key of a job here not in ``leave_out``, of the jobs that have not run
        only those with a need of at most ``floor`` (the others a walk with that floor passes;
        ``NEVER``: every job); None when there is none."""
        key = self.key
        keys = [key.of(j) for j in self.ran.values() if j.job_id not in leave_out]
        fresh = self.fresh
        if floor >= NEVER:
            if fresh.keys:
                keys.append(fresh.keys[0][0])
        elif fresh.keys:
            first = fresh.first_key_at_most(floor)
            if first is not None:
                keys.append(first)
        return min(keys) if keys else None

    def positions(self, offset: int) -> dict[int, int]:
        """``places`` by job id, plus ``offset``."""
        return {j.job_id: offset + i for i, j in self.places()}


# A (key, job) pair's key, for sorts and bisections: a C function (a compiled one is called
# through Python's call protocol, 250 instructions a call).
_first = itemgetter(0)
