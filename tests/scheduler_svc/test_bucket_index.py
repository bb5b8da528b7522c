"""The index over ``Fresh``'s buckets (core/policies/bucket_index.py) against plain loops, and
a walk past a long queue that reads a few buckets, not all of them."""

from __future__ import annotations

import random

import pytest

from scheduler_svc.core.job import Job
from scheduler_svc.core.policies import ranked
from scheduler_svc.core.policies.bucket_index import BucketIndex
from scheduler_svc.core.policies.ranked import Ranked, WalkSkip


@pytest.mark.parametrize("seed", range(8))
def test_runs_match_plain_loops(seed: int) -> None:
    rng = random.Random(seed)
    index = BucketIndex()
    for _ in range(30):
        n = rng.randrange(0, 70)
        least = [rng.randrange(-5, 100) for _ in range(n)]
        sizes = [rng.randrange(1, 130) for _ in range(n)]
        index.rebuild(least, sizes)
        for _ in range(40):
            if n and rng.random() < 0.4:  # one bucket changes in place
                i = rng.randrange(n)
                least[i], sizes[i] = rng.randrange(-5, 100), rng.randrange(1, 130)
                index.set(i, least[i], sizes[i])
            lo = rng.randrange(0, n + 1)
            hi = rng.randrange(lo, n + 1)
            floor = rng.randrange(-10, 110)
            want = next((i for i in range(lo, hi) if least[i] <= floor), hi)
            assert index.first_at_most(lo, hi, floor) == want
            assert index.total(lo, hi) == sum(sizes[lo:hi])


def test_an_empty_index_finds_nothing() -> None:
    index = BucketIndex()
    index.rebuild([], [])
    assert index.first_at_most(0, 0, 10) == 0
    assert index.total(0, 0) == 0


def _key(job: Job) -> tuple[float, int, int]:
    return (float(job.max_tokens), job.num_pending, job.job_id)


def _walk_reads(n: int) -> tuple[list[int], int, int]:
    """A walk past ``n`` waiting jobs that cannot fit, among them one claimed job and one that
    fits (under the floor), with two started jobs ranked among them: the jobs it hands out,
    the jobs it passes, and the buckets whose smallest need it read."""
    r = Ranked(_key)
    jobs = [Job(i, [1] * 500, max_tokens=10 + i, arrival_time=0.0) for i in range(n)]
    small = Job(n, [1] * 5, max_tokens=n // 2 + 5, arrival_time=0.0)
    started = [Job(n + 1, [1] * 500, max_tokens=n // 4, arrival_time=0.0),
               Job(n + 2, [1] * 500, max_tokens=3 * n // 4, arrival_time=0.0)]
    for job in [*jobs, small, *started]:
        r.add(job)
    for job in started:
        r.start(job)
        job.first_scheduled_time = 1.0
    r.settle()
    read: set[int] = set()

    class Counting(list):  # the buckets' smallest needs, noting which the walk reads
        def __getitem__(self, i):  # type: ignore[no-untyped-def]
            read.add(i)
            return super().__getitem__(i)

    r.fresh.least = Counting(r.fresh.least)
    skip = WalkSkip({jobs[2 * n // 3].job_id})
    skip.floor = 100
    got = [j.job_id for j in r.walk(skip)]
    return got, skip.passed, len(read)


def test_a_walk_past_a_long_queue_reads_as_much_at_ten_times_the_queue(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the buckets a walk cannot pass as a whole (the claimed job's, the one under the
    floor, those around the started jobs) and the first of each run it passes are read, as
    few at 20,000 waiting jobs as at 2,000 (passing bucket by bucket read every one: 125 and
    1,250 of 16 jobs)."""
    monkeypatch.setattr(ranked, "BUCKET", 16)
    for n in (2_000, 20_000):
        got, passed, _ = _walk_reads(n)
        # By key: the first started job, the small one, the claimed one, the second started.
        assert got == [n + 1, n, 2 * n // 3, n + 2]
        assert passed == n - 1
    assert _walk_reads(2_000)[2] <= 12
    assert _walk_reads(20_000)[2] <= 12
