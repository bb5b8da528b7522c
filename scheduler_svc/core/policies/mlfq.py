"""Skip-join multi-level feedback queue (FastServe, section 2) and naive MLFQ.

| rule        | what happens                                                                 |
|-------------|------------------------------------------------------------------------------|
| quanta      | Q1 = minimal iteration time; Q(i+1) = ratio x Q(i)                           |
| arrival     | skip-join: the highest queue whose quantum covers the job's first iteration  |
|             | (its first prefill chunk, predicted by the cost model); naive MLFQ: Q1       |
| charge      | every job in an iteration is charged the iteration's measured time           |
| demotion    | service in its queue > quantum: to the first lower queue whose quantum       |
|             | covers its next iteration, at the tail, service reset                        |
| head return | a job that ran and was not demoted goes back to the head of its queue        |
| promotion   | a job that has not run for starve_limit x 2^(times promoted) goes to the     |
|             | tail of Q1 (the limit doubles per promotion: under overload every paused job |
|             | starves, and a fixed limit turned the MLFQ into round robin over all of them) |
| order       | Q1 first, FCFS by arrival into the queue                                     |
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job
from scheduler_svc.core.job_id import JobId
from scheduler_svc.core.policies.base import Policy, register
from scheduler_svc.core.policies.rank_key import KeptKey, Key
from scheduler_svc.core.policies.ranked import NEVER, FreshWalk, Ranked, WalkSkip
from scheduler_svc.core.policies.repeated_sum import add_repeatedly
from scheduler_svc.core.policies.starvation import StarvationClock


class SkipJoinMLFQ(Policy):
    name = "skip-join-mlfq"
    needs_cost_model = True
    skip_join = True
    passes_new_jobs = True

    def __init__(self, config: SchedulerConfig, cost_model: CostModel | None = None):
        super().__init__(config, cost_model)
        assert cost_model is not None
        q1 = config.mlfq_q1_quantum_s or cost_model.min_iteration_time
        self.quanta = [q1 * config.mlfq_ratio ** i for i in range(config.mlfq_num_queues)]
        # Each queue in order of place: a job put at a queue's tail takes the next place up,
        # one returned to its head the next place down (an ordered dict, kept as ``Ranked``
        # so the walk can pass the jobs that have not run and cannot).
        # A job's key is its place, kept on the job (``Job.rank_key``) from one change to the
        # next: read by each queue's walk, not computed per read.
        self._queues = [Ranked(KeptKey()) for _ in range(config.mlfq_num_queues)]
        self._tail = self._head = 0
        # Each job's queue and service there, in one record: a lookup per job per iteration.
        self._entry: dict[int, _Entry] = {}
        self.starvation = StarvationClock(config.starve_limit_s)
        self._decode_s = cost_model.decode_time(1)
        self._prefill_s: dict[int, float] = {}

    def next_iteration_time(self, job: Job) -> float:
        """Predicted time of the job's next iteration: a prefill chunk or one decode (the
        cost model's times, read once per chunk size: it is fixed, and interpreted code)."""
        pending = job.num_pending
        if pending <= 1:
            return self._decode_s
        n = min(pending, self.config.max_batched_tokens)
        t = self._prefill_s.get(n)
        if t is None:
            assert self.cost_model is not None
            t = self._prefill_s[n] = self.cost_model.prefill_time(n)
        return t

    def level_for(self, t: float, start: int = 0) -> int:
        """The first queue at or below ``start`` whose quantum covers ``t``."""
        for i in range(start, len(self.quanta)):
            if self.quanta[i] >= t:
                return i
        return len(self.quanta) - 1

    def add(self, job: Job, now: float) -> None:
        lvl = self.level_for(self.next_iteration_time(job)) if self.skip_join else 0
        self._place(job, lvl)
        self._touch(job.job_id, now)

    def _touch(self, jid: JobId, now: float) -> None:
        self.starvation.touch(jid, now)

    def _key(self, job: Job) -> Key:
        return job.rank_key

    @property
    def level(self) -> dict[int, int]:
        """Each job's queue (0 is Q1)."""
        return {jid: e.level for jid, e in self._entry.items()}

    @property
    def service(self) -> dict[int, float]:
        """Each job's service in its queue so far."""
        return {jid: e.service for jid, e in self._entry.items()}

    def _place(self, job: Job, lvl: int) -> None:
        """At the tail of queue ``lvl``, with no service in it yet."""
        self._entry[job.job_id] = _Entry(job, lvl)
        self._tail += 1
        job.rank_key = (float(self._tail),)
        self._queues[lvl].add(job)

    def remove(self, job: Job) -> None:
        jid = job.job_id
        entry = self._entry.pop(jid, None)
        if entry is not None:
            self._queues[entry.level].remove(jid)
            self.starvation.forget(jid)

    def order(self, now: float) -> Iterable[Job]:
        return self.walk(now, None)

    def walk(self, now: float, skip: WalkSkip | None) -> Iterable[Job]:
        for queue in self._queues:
            queue.settle()
        self._promote_starving(now)
        return QueuesWalk(self._queues, skip)

    def _promote_starving(self, now: float) -> None:
        for jid in self.starvation.starving(now):
            entry = self._entry[jid]
            if entry.level == 0:
                continue  # already in Q1; it is pushed again when it next runs
            self._queues[entry.level].remove(jid)
            self._place(entry.job, 0)
            self.starvation.promoted(jid)
            self._touch(jid, now)
            self.num_promotions += 1

    def on_start(self, job: Job) -> None:
        self._queues[self._entry[job.job_id].level].start(job)

    def on_iteration(self, ran: list[Job], elapsed_s: float, now: float) -> None:
        for queue in self._queues:
            queue.settle()
        stay: list[Job] = []
        entries, quanta = self._entry, self.quanta
        last = len(quanta) - 1
        for job in ran:
            jid = job.job_id
            entry = entries.get(jid)
            if entry is None:
                continue
            self._touch(jid, now)
            entry.service += elapsed_s
            lvl = entry.level
            if entry.service > quanta[lvl] and lvl < last:
                self._queues[lvl].remove(jid)
                self._place(job, self.level_for(self.next_iteration_time(job), lvl + 1))
                self.num_demotions += 1
            else:
                stay.append(job)
        for job in reversed(stay):  # back to the head, keeping their batch order
            self._head -= 1
            job.rank_key = (float(self._head),)  # a job that ran: its key is read anew

    def steady_iterations(self, batch: list[Job], iteration_s: float,
                          starts: list[float], floor: int = NEVER) -> int:
        """Until the first demotion of a batch job (its service summed as ``on_iteration``
        sums it) or the first starvation deadline: a job that ran and stays goes back to the
        head of its queue, so the order is unchanged in between (a job that arrives joins a
        queue's tail, behind the batch's jobs of that queue; one in a queue above them is
        passed, or ends the run, ``steady.window``)."""
        k = self.starvation.none_starve(starts)
        last = len(self.quanta) - 1
        for job in batch:
            entry = self._entry[job.job_id]
            lvl = entry.level
            if lvl == last:
                continue
            service, quantum, m = entry.service, self.quanta[lvl], 0
            while m < k:
                service += iteration_s
                m += 1
                if service > quantum:
                    break  # demoted after its m-th iteration
            k = m
        return k

    def batch_order(self, batch: list[Job], floor: int, full: bool) -> list[Job] | None:
        """By queue, then place (a demoted job at its new queue's tail); first unless a job
        the walk reads (one that has run, or needs at most ``floor``) is in a queue above the
        last of them, or in its queue before it."""
        entries = self._entry
        order = sorted(batch, key=lambda j: (entries[j.job_id].level, j.rank_key))
        ids: set[int] = {j.job_id for j in batch}
        bottom = entries[order[-1].job_id].level if full else len(self._queues) - 1
        for lvl in range(bottom + 1):
            first = self._queues[lvl].least_key(ids, floor)
            if first is not None and (not full or lvl < bottom or first < self._key(order[-1])):
                return None
        return order

    def starves_after_s(self) -> float:
        return self.starvation.limit_s

    def enst(self, now: float, batch_size: int, iteration_s: float,
             started_only: bool = False) -> dict[int, float]:
        """``ENST(i) = min(T_promote(i), T_execute(i))`` (FastServe section 3).

        T_promote: time left until starvation promotion lifts job i to Q1 (none for a Q1 job).
        T_execute: ``(1/B) * sum over the jobs j ahead of i`` of the service j receives before
        it is demoted below i's queue: what is left of j's quantum in its own queue plus the
        full quanta of the queues from just below j's down to i's. One pass in priority order
        with running sums, so it costs O(live jobs). A job that has not run has had no
        service: under overload the queue is mostly such jobs, and with ``started_only`` a run
        of them between two started jobs (counted from ``Ranked.places``, not read) adds its
        terms at once (``add_repeatedly``: the same sums, bit for bit, as one addition per
        job), so the cost is per started job, not per queued one.
        """
        self._promote_starving(now)
        # below[l] = sum of the quanta of queues 0..l-1.
        below = [0.0]
        for q in self.quanta:
            below.append(below[-1] + q)
        out: dict[int, float] = {}
        ahead = rem_sum = below_sum = 0.0
        for lvl, queue in enumerate(self._queues):
            quantum, below_next = self.quanta[lvl], below[lvl + 1]
            if started_only:  # the runs of jobs that have not run, counted, not read
                placed, size = queue.places(), len(queue)
            else:
                placed, size = list(enumerate(queue.walk(None))), 0
            last = -1
            for place, job in [*placed, (size, None)]:
                run = place - last - 1
                if run > 0:  # as below, with no service yet: each one's whole quantum is left
                    ahead += run  # whole numbers: exact
                    rem_sum = add_repeatedly(rem_sum, max(quantum - 0.0, 0.0), run)
                    below_sum = add_repeatedly(below_sum, below_next, run)
                last = place
                if job is None:
                    break
                jid = job.job_id
                t_exec = (rem_sum + ahead * below[lvl + 1] - below_sum) / batch_size
                t_promote = self.starvation.time_left(jid, now) if lvl else float("inf")
                out[jid] = min(t_exec, t_promote)
                ahead += 1
                rem_sum += max(self.quanta[lvl] - self._entry[jid].service, 0.0)
                below_sum += below[lvl + 1]
        return out

    def queues(self) -> list[tuple[str, int]]:
        return [(f"Q{i + 1}", len(q)) for i, q in enumerate(self._queues)]


class _Entry:
    """A job in the MLFQ: its queue, and its service there since it was placed."""

    def __init__(self, job: Job, level: int):
        self.job = job
        self.level = level
        self.service = 0.0


class QueuesWalk:
    """The queues' walks one after another, Q1 first, as one iterator: each queue's walk is
    begun once the one before it ends, and read with ``next_job`` (no generator between)."""

    def __init__(self, queues: list[Ranked], skip: WalkSkip | None):
        self.queues = queues
        self.skip = skip
        self.i = 0  # queues begun
        self.walk: FreshWalk | None = None

    def __iter__(self) -> QueuesWalk:
        return self

    def __next__(self) -> Job:
        while True:
            walk = self.walk
            if walk is not None:
                job = walk.next_job()
                if job is not None:
                    return job
            if self.i == len(self.queues):
                raise StopIteration
            self.walk = self.queues[self.i].walk(self.skip)
            self.i += 1


class NaiveMLFQ(SkipJoinMLFQ):
    """Every arrival joins Q1, whatever its prompt (the baseline skip-join improves on)."""

    name = "mlfq"
    skip_join = False


register(SkipJoinMLFQ)
register(NaiveMLFQ)
