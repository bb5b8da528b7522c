"""Shortest predicted remaining output first, with attained service as the safety net.

| rule        | what happens                                                                 |
|-------------|------------------------------------------------------------------------------|
| rank        | predicted output tokens still to come, fewest first (SRPT on predictions)     |
| wrong guess | a job past its prediction, or with none, ranks by the tokens it has made     |
|             | (least attained service, as an MLFQ approximates): the longer it has run,   |
|             | the longer it is likely to run, so an underestimated job sinks               |
| starvation  | a job that has not run for starve_limit x (1 + remaining / starve_tokens)    |
|             | x 2^(times promoted) goes to the front until it runs (the MLFQ's promotion,  |
|             | with the same backoff, and a wait that grows with the job's predicted size)  |
| ties        | less prefill left first (a job already running before a new one), then       |
|             | arrival order: at equal remaining output, the oracle's own tie-break         |
| aging       | off by default; with predictive_aging_s = A, a later job passes an earlier   |
|             | one only if predicted to have under 2^-(t / A) times as much left, t s later |
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job
from scheduler_svc.core.policies.base import Policy, enst_by_place, register
from scheduler_svc.core.policies.rank_key import Key, RankKey
from scheduler_svc.core.policies.ranked import NEVER, Ranked, WalkSkip
from scheduler_svc.core.policies.starvation import StarvationClock

# The starvation limit grows with the job's predicted size, ``starve_limit x (1 + remaining /
# starve_tokens)``: a fixed limit for every job undid the shortest-first order under load (the
# long jobs it promotes are the ones SRPT holds back): 248 ms mean latency per token against
# 145 ms with the size scaling at 16 tokens per limit and 142 ms with no starvation prevention
# at all (1,000 Azure conversations, 3 req/s, prediction sigma 0.75). At 4 tokens per limit
# (the default) throughput at the SLO under bursts rose again (docs/benchmarks.md, "A
# starvation limit in proportion to the job"); the wait of a long job stays bounded.


class Predictive(Policy):
    name = "predictive"
    passes_new_jobs = True
    ranks_by_prediction = True

    def __init__(self, config: SchedulerConfig, cost_model: CostModel | None = None):
        super().__init__(config, cost_model)
        self._jobs: dict[int, Job] = {}
        # Promoted for starving, until they run: ahead of every job in _ranked. Under
        # overload most of the queue starves, so these are kept ranked too.
        self._boosted = Ranked(_Key(self))
        self._ranked = Ranked(_Key(self))
        self.starvation = StarvationClock(config.starve_limit_s)
        self._starve_tokens = config.starve_tokens
        self._aging_s = config.predictive_aging_s

    @classmethod
    def remaining(cls, job: Job) -> float:
        """Predicted output tokens still to come (see the module doc)."""
        return cls._remaining(job.predicted_output_tokens, len(job.output))

    @staticmethod
    def _remaining(predicted: float | None, made: int) -> float:
        """``remaining`` of a job predicted ``predicted`` tokens that has made ``made``."""
        if predicted is None or predicted <= made:
            return float(made)
        return predicted - made

    def remaining_work(self, job: Job) -> float | None:
        # A job not yet estimated (before its first token or arrival probe) ranks by the
        # tokens it has made, nearly always none: that is no measure of its work, and taken
        # as one, every new job could take the blocks of any running job. On the real cluster
        # under memory pressure that made 8-22 swap-outs per run and a mean JCT 1.17-1.44x
        # that of not displacing running jobs (docs/benchmarks.md, "Only an estimated job
        # takes room from running jobs").
        if job.predicted_output_tokens is None:
            return None
        return self.remaining(job)

    def _key(self, job: Job) -> Key:
        return self._key_at(job, len(job.output))

    def _key_at(self, job: Job, made: int) -> Key:
        """``job``'s key once it has made ``made`` tokens, its prediction and the tokens it
        has yet to compute as now (a decode adds one to both its tokens and its KV). Aged
        (``predictive_aging_s`` = A > 0): ``log2(remaining + 1) + arrival / A``, the same
        order among jobs that arrived together, and a job passes an earlier one only if
        predicted to have under ``2^-(t / A)`` times as much left, t seconds later."""
        # The tie-break matters: with exact predictions it took the mean latency per token
        # from 179 to 142 ms (1,000 Azure conversations at 3 req/s), the oracle's figure.
        remaining = self._remaining(job.predicted_output_tokens, made)
        if self._aging_s:
            return (math.log2(remaining + 1.0) + job.arrival_time / self._aging_s,
                    job.num_pending, job.job_id)
        return (remaining, job.num_pending, job.job_id)

    def _touch(self, job: Job, now: float) -> None:
        self.starvation.touch(job.job_id, now, 1.0 + self.remaining(job) / self._starve_tokens)

    def add(self, job: Job, now: float) -> None:
        self._jobs[job.job_id] = job
        self._ranked.add(job)
        self._touch(job, now)

    def on_estimate(self, job: Job, now: float) -> None:
        # Ranked as if predicted at arrival: its key, and its starvation deadline counted from
        # its arrival with the limit its predicted size gives (a promoted job stays promoted).
        jid = job.job_id
        if jid not in self._jobs:
            return
        if self._boosted.remove(jid):
            self._boosted.add(job)
            return
        self._ranked.remove(jid)
        self._ranked.add(job)
        self._touch(job, job.arrival_time)

    def remove(self, job: Job) -> None:
        jid = job.job_id
        if self._jobs.pop(jid, None) is not None:
            if not self._boosted.remove(jid):
                self._ranked.remove(jid)
            self.starvation.forget(jid)

    def _promote(self, now: float) -> None:
        for jid in self.starvation.starving(now):
            if jid in self._boosted:
                continue  # already at the front
            self._ranked.remove(jid)
            self._boosted.add(self._jobs[jid])
            self.starvation.promoted(jid)
            self.num_promotions += 1

    def order(self, now: float) -> Iterable[Job]:
        return self.walk(now, None)

    def walk(self, now: float, skip: WalkSkip | None) -> Iterator[Job]:
        self._boosted.settle()
        self._ranked.settle()
        self._promote(now)
        yield from self._boosted.walk(skip)
        yield from self._ranked.walk(skip)

    def enst(self, now: float, batch_size: int, iteration_s: float,
             started_only: bool = False) -> dict[int, float]:
        if not started_only:
            return super().enst(now, batch_size, iteration_s)
        self._promote(now)
        places = self._boosted.positions(0)
        places.update(self._ranked.positions(len(self._boosted)))
        return enst_by_place(places, batch_size, iteration_s)

    def on_start(self, job: Job) -> None:
        self._boosted.start(job)
        self._ranked.start(job)

    def on_iteration(self, ran: list[Job], elapsed_s: float, now: float) -> None:
        self._boosted.settle()
        self._ranked.settle()
        for job in ran:
            jid = job.job_id
            if jid in self._jobs:
                if self._boosted.remove(jid):
                    self._ranked.add(job)
                self._touch(job, now)

    def steady_iterations(self, batch: list[Job], iteration_s: float,
                          starts: list[float], floor: int = NEVER) -> int:
        """Until the first starvation deadline, or the first iteration whose keys (the batch's
        jobs each one token further) no longer put the batch in its order ahead of every
        other job the walk reads (jobs that have not run and need more than ``floor`` are
        passed wherever they rank): only the batch's keys move (one down per decode before
        a job's prediction, one up past it), each computed as the walk computes it. A
        promoted job of the batch is back at its rank by now, and checked there like the
        others; a promoted job outside it would run first, unless the walk passes it (under
        overload, starving jobs that find no room): none then."""
        if self._starving_read(floor):
            return 0
        limit = self.starvation.none_starve(starts)
        ids: set[int] = {job.job_id for job in batch}
        least = self._ranked.least_key(ids, floor)
        made = [len(job.output) for job in batch]
        for k in range(limit):
            prev: Key | None = None
            for job, m in zip(batch, made):
                key = self._key_at(job, m + k)
                if prev is not None and key <= prev:
                    return k
                prev = key
            if least is not None and prev is not None and prev >= least:
                return k
        return limit

    def batch_order(self, batch: list[Job], floor: int, full: bool) -> list[Job] | None:
        """By key; first unless a starving job the walk reads is waiting, or another job it
        reads ranks before the last of them (with a batch not ``full``: exists at all)."""
        if self._starving_read(floor):
            return None
        order = sorted(batch, key=self._key)
        first = self._ranked.least_key({j.job_id for j in batch}, floor)
        if first is not None and (not full or first < self._key(order[-1])):
            return None
        return order

    def _starving_read(self, floor: int) -> bool:
        """Whether a promoted job waits that a walk with ``floor`` would read (it runs first)."""
        return len(self._boosted) > 0 and self._boosted.least_key(set(), floor) is not None

    def starves_after_s(self) -> float:
        return self.starvation.limit_s  # a job's limit is this times 1 + remaining / tokens

    def queues(self) -> list[tuple[str, int]]:
        return [("starving", len(self._boosted)),
                ("ranked", len(self._jobs) - len(self._boosted))]


class _Key(RankKey):
    def __init__(self, policy: Predictive):
        self.policy = policy

    def of(self, job: Job) -> Key:
        return self.policy._key(job)


register(Predictive)
