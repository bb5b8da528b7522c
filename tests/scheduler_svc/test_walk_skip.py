"""The policies that keep their jobs ranked between iterations (``core/policies/ranked.py``):
their order is the one a full sort gives, and a walk that passes new jobs which cannot run
plans exactly what a walk reading every job plans."""

from __future__ import annotations

import random

import pytest
from test_steady import Req, overload, sim

import scheduler_svc.core.batcher as batcher
from scheduler_svc.core.kv.policies import KV_POLICY_CLASSES
from scheduler_svc.core.policies import POLICIES
from scheduler_svc.core.policies.ranked import WalkSkip

RANKED = sorted(name for name, cls in POLICIES.items() if cls.passes_new_jobs)


def crowd(n: int, rate: float, seed: int = 2) -> list[Req]:
    """``test_steady.overload`` with long prompts too, faster: a queue of new jobs most of
    which cannot start, as under overload at scale."""
    rng = random.Random(seed)
    reqs = overload(n, rate, seed)
    return [Req(r.arrival_s, r.input_tokens if rng.random() < 0.3 else rng.randint(100, 900),
                r.output_tokens) for r in reqs]


def test_the_ranked_policies_are_the_sorting_and_queueing_ones():
    assert RANKED == ["fixed-priority", "mlfq", "predictive", "skip-join-mlfq", "srpt-oracle"]


@pytest.mark.parametrize("kv", sorted(KV_POLICY_CLASSES))
@pytest.mark.parametrize("policy", RANKED)
def test_passing_new_jobs_changes_no_plan(policy, kv, monkeypatch):
    reqs = crowd(200, rate=40.0)
    skips: list[WalkSkip] = []

    class Counted(WalkSkip):
        def __init__(self, claimed):
            super().__init__(claimed)
            skips.append(self)

    monkeypatch.setattr(batcher, "WalkSkip", Counted)
    passing = sim(reqs, policy, kv, fast=True)
    passed = sum(s.passed for s in skips)
    monkeypatch.setattr(POLICIES[policy], "passes_new_jobs", False)
    skips.clear()
    reading = sim(reqs, policy, kv, fast=True)
    assert sum(s.passed for s in skips) == 0
    assert passing.records == reading.records
    assert passing.summary() == reading.summary()
    assert passed > 0  # the queue builds up: the walk did pass jobs


def _reference(policy) -> list[int]:
    """The policy's order by a full sort of its live jobs."""
    if policy.name in ("mlfq", "skip-join-mlfq"):
        entries = policy._entry.values()
        return [e.job.job_id for e in sorted(entries, key=lambda e: (e.level, e.job.rank_key))]
    if policy.name == "predictive":
        boosted = policy._boosted
        return [j.job_id for j in sorted(
            policy._jobs.values(), key=lambda j: (j.job_id not in boosted, policy._key(j)))]
    ranked = policy._ranked
    jobs = [*ranked.ran.values(), *(j for b in ranked.fresh.jobs for j in b)]
    return [j.job_id for j in sorted(jobs, key=policy._full_key)]


@pytest.mark.parametrize("policy", RANKED)
def test_the_kept_order_is_a_full_sort_after_every_iteration(policy, monkeypatch):
    cls = POLICIES[policy]
    checked = [0]
    real = cls.on_iteration

    def on_iteration(self, ran, elapsed_s, now):
        real(self, ran, elapsed_s, now)
        assert [j.job_id for j in self.order(now)] == _reference(self)
        checked[0] += 1

    monkeypatch.setattr(cls, "on_iteration", on_iteration)
    sim(overload(120, rate=20.0), policy, "proactive", fast=False)
    assert checked[0] > 100
