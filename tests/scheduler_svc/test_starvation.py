"""The starvation clock against the plainest one (a heap entry per touch, stale ones skipped):
the same jobs starve at the same times in the same order, whatever the touches, scales,
promotions and departures, with a heap entry per job per limit it runs, not per touch."""

from __future__ import annotations

import heapq
import random

import pytest

from scheduler_svc.core.policies.starvation import StarvationClock


class PlainClock:
    def __init__(self, limit_s: float):
        self.limit_s = limit_s
        self.deadline: dict[int, float] = {}
        self.times_promoted: dict[int, int] = {}
        self.waits: list[tuple[float, int]] = []

    def touch(self, jid: int, now: float, scale: float = 1.0) -> None:
        limit = self.limit_s * scale * 2 ** self.times_promoted.get(jid, 0)
        self.deadline[jid] = now + limit
        heapq.heappush(self.waits, (now + limit, jid))

    def forget(self, jid: int) -> None:
        del self.deadline[jid]
        self.times_promoted.pop(jid, None)

    def promoted(self, jid: int) -> None:
        self.times_promoted[jid] = self.times_promoted.get(jid, 0) + 1

    def starving(self, now: float) -> list[int]:
        out = []
        while self.waits and now > self.waits[0][0]:
            deadline, jid = heapq.heappop(self.waits)
            if self.deadline.get(jid) == deadline and jid not in out:  # once per deadline
                out.append(jid)
        return out

    def next_deadline(self) -> float:
        live = [d for d, j in self.waits if self.deadline.get(j) == d]
        return min(live, default=float("inf"))


@pytest.mark.parametrize("seed", range(25))
def test_the_same_jobs_starve_in_the_same_order_as_with_an_entry_per_touch(seed):
    rng = random.Random(seed)
    clock, plain = StarvationClock(1.0), PlainClock(1.0)
    now, live, next_id = 0.0, set(), 0
    for _ in range(3000):
        now += rng.choice([0.01, 0.03, 0.2])
        op = rng.random()
        if op < 0.05 or not live:
            jid, next_id = next_id, next_id + 1
            live.add(jid)
            scale = rng.choice([1.0, 1.0 + rng.uniform(0, 30)])
            clock.touch(jid, now, scale)
            plain.touch(jid, now, scale)
        elif op < 0.08:
            jid = rng.choice(sorted(live))
            live.discard(jid)
            clock.forget(jid)
            plain.forget(jid)
        else:
            # A batch runs: each job touched, with a scale that shrinks as its work does.
            for jid in rng.sample(sorted(live), min(len(live), 4)):
                scale = rng.choice([1.0, 0.5, 1.0 + rng.uniform(0, 30)])
                clock.touch(jid, now, scale)
                plain.touch(jid, now, scale)
        if rng.random() < 0.3:
            horizon = now + rng.uniform(0, 2)
            want = plain.next_deadline()
            got = clock.next_deadline(horizon)
            assert got == want if want <= horizon else got > horizon
        starving = list(clock.starving(now))
        assert starving == plain.starving(now)
        for jid in starving:
            if rng.random() < 0.7:  # promoted (its next limit doubles), and touched
                clock.promoted(jid)
                plain.promoted(jid)
                clock.touch(jid, now)
                plain.touch(jid, now)
        assert clock.deadlines() == plain.deadline
    assert len(clock._waits) < len(plain.waits) / 3, (len(clock._waits), len(plain.waits))


def test_a_job_touched_every_iteration_costs_the_heap_an_entry_per_limit():
    clock = StarvationClock(3.0)
    now = 0.0
    for i in range(1000):  # 30 s of iterations; its predicted work shrinks as it decodes
        now += 0.03
        clock.touch(7, now, 1.0 + (1000 - i) / 4)
        assert list(clock.starving(now)) == []
    assert len(clock._waits) <= 30 / 3.0 + 1
    assert clock.next_deadline() == pytest.approx(now + 3.0 * (1.0 + 1 / 4))
    assert list(clock.starving(now + 3.8)) == [7]
    assert list(clock.starving(now + 1e6)) == [] and clock._waits == []
