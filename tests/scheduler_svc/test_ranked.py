"""The ranked job set the sorting policies keep between iterations (core/policies/ranked.py):
the order, the jobs a walk passes, and the places ENST reads, against a plain sort."""

from __future__ import annotations

import random

import pytest

from scheduler_svc.core.job import Job
from scheduler_svc.core.policies import ranked
from scheduler_svc.core.policies.rank_key import KeptKey
from scheduler_svc.core.policies.ranked import Ranked, WalkSkip


def _key(job: Job) -> tuple[float, int, int]:
    # Like predictive's: moves with the tokens made, fixed before the first run.
    return (float(job.max_tokens - len(job.output)), job.num_pending, job.job_id)


def _static_key(job: Job) -> tuple[float, int, int]:
    # Like fixed-priority's: never moves, not even once the job runs.
    return (float(len(job.prompt) % 7), job.job_id, 0)


def _job(jid: int, rng: random.Random) -> Job:
    prompt = [1] * rng.choice([1, 2, 5, 17, 40, 90, 300])
    return Job(jid, prompt, max_tokens=rng.randrange(1, 60), arrival_time=0.0)


def _expected(jobs: dict[int, Job], floor_of, claimed: set[int],
              key=_key) -> tuple[list[int], int]:
    """The walk by a full sort, each job that has not run judged against the floor where the
    walk stands (it moves only when a job is handed out)."""
    out, passed = [], 0
    for job in sorted(jobs.values(), key=key):
        if (not job.started and ranked.need(job) > floor_of(len(out))
                and job.job_id not in claimed):
            passed += 1
            continue
        out.append(job.job_id)
    return out, passed


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("bucket", [1, 3, 64])
@pytest.mark.parametrize("mode", ["moving", "static", "kept"])
def test_walks_and_places_match_a_full_sort(seed: int, bucket: int, mode: str,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranked, "BUCKET", bucket)
    rng = random.Random(seed)
    static = mode == "static"
    key = _static_key if static else _key
    # "kept": the keys read from the jobs, where the owner keeps them (as the MLFQ does),
    # never computed.
    kept = mode == "kept"
    r = Ranked(KeptKey()) if kept else Ranked(key, static=static)
    jobs: dict[int, Job] = {}
    next_id = 0
    for _ in range(40):
        for _ in range(rng.randrange(0, 30)):  # arrivals
            job = _job(next_id, rng)
            next_id += 1
            jobs[job.job_id] = job
            if kept:
                job.rank_key = key(job)
            r.add(job)
        for job in rng.sample(list(jobs.values()), min(len(jobs), rng.randrange(0, 8))):
            del jobs[job.job_id]  # finished or cancelled
            assert r.remove(job.job_id)
        live = list(jobs.values())
        for job in rng.sample(live, min(len(live), rng.randrange(0, 6))):  # planned
            if not job.started:
                r.start(job)
                job.first_scheduled_time = 1.0
        # ENST's places, with some jobs started in this Step (still counted as fresh).
        full = sorted(jobs.values(), key=key)
        want = {j.job_id: i for i, j in enumerate(full) if j.started}
        assert r.positions(3) == {jid: i + 3 for jid, i in want.items()}
        # A walk passing nothing is the full order.
        r.settle()
        assert [j.job_id for j in r.walk(None)] == [j.job_id for j in full]
        # A walk with a floor that moves as jobs are handed out (blocks taken, or freed).
        base = rng.choice([-50, 6, 41, 91, 10_000])  # some right at a need
        moves = [0, *(rng.randrange(-80, 80) for _ in range(6))]
        # No claim (the common case, a scan of needs alone) or two.
        claimed = {j.job_id for j in rng.sample(full, min(len(full), rng.choice([0, 2])))}

        def floor_of(n: int, base: int = base, moves: list[int] = moves) -> int:
            return base + moves[n % len(moves)]

        got: list[int] = []
        skip = WalkSkip(claimed)
        walk = r.walk(skip)
        while True:  # as the batcher walks: the floor set before each job it asks for
            skip.floor = floor_of(len(got))
            job = next(walk, None)
            if job is None:
                break
            got.append(job.job_id)
        assert (got, skip.passed) == _expected(jobs, floor_of, claimed, key)
        # The least key a walk with a floor would read, some started jobs left out (a batch).
        started = [j for j in full if j.started]
        leave = {j.job_id for j in rng.sample(started, min(len(started), 3))}
        floor = rng.choice([ranked.NEVER, base])
        assert r.least_key(leave, floor) == min(
            (key(j) for j in full if j.job_id not in leave
             and (j.started or ranked.need(j) <= floor)), default=None)
        for job in jobs.values():  # made a token: keys of started jobs move
            if job.started and rng.random() < 0.5 and len(job.output) < job.max_tokens:
                job.output.append(0)
                job.kv.num_computed = job.num_tokens - 1
                if kept:
                    job.rank_key = key(job)
        r.settle()  # as a policy does when a Step's results come
    assert len(r) == len(jobs)


def test_a_one_token_prompt_is_never_passed() -> None:
    r = Ranked(_key)
    one = Job(0, [7], max_tokens=4, arrival_time=0.0)
    long = Job(1, [7] * 50, max_tokens=4, arrival_time=0.0)
    r.add(one)
    r.add(long)
    skip = WalkSkip(set())
    skip.floor = -(10 ** 9)
    assert [j.job_id for j in r.walk(skip)] == [0]
    assert skip.passed == 1
