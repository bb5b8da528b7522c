"""One priority walk that forms a batch under the batch-size, token and KV-block budgets.

The batch is the highest-priority jobs that fit, up to ``max_batch_size``. Decodes join at
once; prefill chunks are sized afterwards from the token budget the decodes left, so a long
prompt's prefill never pushes a higher-priority decode out of the batch. A job starts only
when blocks for its whole prompt (and first token) are free above the watermark; a job that
does not fit waits without blocking the jobs behind it, except under in-order admission
(FCFS-like policies with a KV policy that moves KV, as in vLLM). When nothing at all fits,
the oldest started job takes blocks from the newest (``_make_room``), so nothing deadlocks.
"""

from __future__ import annotations

from collections.abc import Iterable

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import Command, NewJobSpec
from scheduler_svc.core.job import Job, JobStatus
from scheduler_svc.core.kv.allocator import blocks_for
from scheduler_svc.core.kv.displace import Displacement
from scheduler_svc.core.kv.ledger import KVLedger
from scheduler_svc.core.kv.policies import KVPolicy
from scheduler_svc.core.policies.ranked import ALWAYS, NEVER, WalkSkip
from scheduler_svc.core.start_reserve import StartReserve
from scheduler_svc.core.step_context import StepContext


class Batcher:
    def __init__(self, config: SchedulerConfig, ledger: KVLedger, kv_policy: KVPolicy):
        self._promised = 0  # blocks held for new jobs in this Step's prefills, in all
        self._promises: dict[int, int] = {}
        self._sure: set[int] = set()  # prefills whose blocks are held or promised
        self._trimmed: list[Job] = []  # prefills _trim dropped, in walk order
        self.config = config
        self.ledger = ledger
        self.kv_policy = kv_policy
        self.reserve = StartReserve(config, ledger, kv_policy)
        # Free blocks a new job must leave as it starts (``StartReserve``; the probes read it).
        self.start_reserve = self.reserve.watermark_blocks

    def form(self, step: StepContext, num_live: int, num_waiting: int,
             num_waiting_single: int = 0) -> None:
        """Fill ``step.plan`` with this Step's batch (and the swaps it needs).
        ``num_waiting_single``: waiting jobs with a one-token prompt (they join as decodes)."""
        plan, now, policy = step.plan, step.now, step.policy
        ledger, kvp, config = self.ledger, self.kv_policy, self.config
        max_batch = step.max_batch or config.max_batch_size
        self.start_reserve = self.reserve.blocks(policy.arrivals_preempt, max_batch,
                                                 step.iterations)
        chosen, rank, busy = step.chosen, step.rank, step.busy
        budget = config.max_batched_tokens
        holders_seen = 0
        free = ledger.num_free
        num_holding = len(ledger.holding)
        # Once every job holding blocks has been seen, the rest can only run on free blocks:
        # stop there if none can take them (a long queue then costs nothing per iteration).
        evicted = num_live - num_waiting - num_holding
        stuck = free == 0 or (free <= self.start_reserve and evicted == 0)
        prefills: list[Job] = []
        bs = ledger.block_size
        space = Displacement(kvp, ledger, step) if kvp.may_evict() else None
        # A new job that must displace paused jobs takes a batch slot only while the blocks of
        # the holders behind it (and, when swapping, the store's room) can cover every such
        # job so far: otherwise jobs that cannot start would fill the batch's slots and stop
        # the walk before the paused jobs that could run.
        displaceable = ledger.allocator.num_used - ledger.num_outgoing()
        claimed = 0
        # Under a policy whose arrivals never outrank started jobs (FCFS, RTC) and a KV policy
        # that moves or drops KV, admission is in order, as in vLLM: once a new job does not
        # fit, the new jobs behind it wait too, and no new job displaces a started one.
        # Otherwise younger jobs take the blocks the older one waits for, and it displaces
        # them mid-decode (measured: 8,000 offloads for 1,000 requests, 12x the mean JCT).
        # Under defer nothing is displaced, so a job that fits may go ahead of one that waits.
        strict = not policy.arrivals_preempt and kvp.displaces
        # A new job ranked first by its work may take the blocks of started jobs with
        # ``displace_running_ratio`` times its work before the walk batches them.
        ratio = config.displace_running_ratio
        admission_closed = False
        # Once admission is closed and every started job is seen, only new jobs are left and
        # all wait (one-token prompts too): the walk ends there.
        num_started, started_seen = num_live - num_waiting, 0
        commands = plan.commands
        # Jobs whose upload is still copying: a command for one would hold the whole
        # iteration until its copy ends. They run from a later Step, the copy overlapping
        # this one's compute, unless nothing else can run now (then the wait is free).
        deferred: list[Job] = []
        # Prefill chunks are sized after the walk from the tokens the decodes leave, in walk
        # order, and a new job needs its whole prompt's blocks. A prefill that would get no
        # tokens, or blocks already promised to a new job walked before it, takes no batch
        # slot: such jobs used to fill the batch's slots and then compute nothing, while
        # decodable jobs behind them waited.
        self._promised, self._promises, self._sure, self._trimmed = 0, {}, set(), []
        # Once prefills sure of their blocks (held, or promised) cover the token budget, a new
        # job walked after them gets no token: it takes no slot, promise or room (``unfed``,
        # counted as passed), and once every started job is seen the walk ends, so a long
        # queue costs nothing per iteration (FCFS walked it all: 0.1 ms per waiting job).
        unfed = 0
        # A started job left without the blocks it needed (to grow, or to go on with its
        # prefill): the paused KV the start reserve keeps in check (``StartReserve``). Only
        # started jobs, which every walk reads: new ones may be passed unread.
        started_short = False
        skip = (WalkSkip(ledger.claimants()) if policy.passes_new_jobs and not strict
                else None)
        kvp.begin_walk()
        walk = iter(policy.walk(now, skip))
        while True:
            # Where the walk stands now, for the policy to pass new jobs that cannot run.
            if skip is not None:
                skip.floor = (NEVER if len(commands) + len(prefills) >= max_batch
                              else self._floor(budget, started_seen == num_started, prefills,
                                               space, displaceable, claimed, step))
            job = next(walk, None)
            if job is None:
                break
            if budget <= 0 or (len(commands) + len(prefills) >= max_batch
                               and not self._trim(prefills, budget)):
                break
            if job.started:
                started_seen += 1
            else:
                covered = self._sure and self._covers(prefills, budget)
                if started_seen == num_started and num_waiting_single == 0 and covered:
                    break
                if covered and len(job.prompt) > 1:  # one-token prompts join as decodes
                    unfed += 1
                    continue
                if admission_closed:  # a new job behind one that waits: it waits too
                    if started_seen == num_started or (stuck and holders_seen == num_holding):
                        break
                    continue
            if busy and job.job_id in busy:
                continue  # in a plan still in flight: at most one plan at a time
            rank[job.job_id] = len(rank)
            kv = job.kv
            if kv.blocks:
                holders_seen += 1
                displaceable -= len(kv.blocks)
            elif stuck and holders_seen == num_holding:
                break
            if kv.stored:  # offloaded: swapped in now, in the Step that runs it
                if job.job_id in plan.swap_out:
                    continue  # offloaded by this very plan: back once the result confirms it
                # Reactive swapping, once other jobs are batched, neither copies while the copy
                # engine is busy past two iterations (queued uploads held blocks idle: ShareGPT
                # 0.78x FCFS) nor makes room (each upload evicted the next paused job: 0.92x);
                # never from blocks promised to new jobs walked before (a livelock).
                batched = bool(commands or prefills or deferred)
                if (not kvp.plans_ahead and batched
                        and ledger.copies.backlog() > 2 * step.iteration_s):
                    continue
                n = 1 if job.num_pending == 1 else min(job.num_pending, budget)
                need = blocks_for(kv.num_computed + n, bs)
                if (need > ledger.num_free and space is not None and not kvp.plans_ahead
                        and not self._promised and not batched):
                    space.make(job, need - ledger.num_free, ())
                if need + self._promised > ledger.free_for(job):
                    continue
                # Uploads still copying run in a later Step: at most a batch's worth of them.
                if len(commands) + len(prefills) + len(deferred) >= max_batch:
                    continue
                ledger.swap_in(job, plan)
                if ledger.upload_pending(job, now):
                    deferred.append(job)
                    continue
                if job.num_pending > 1:
                    prefills.append(job)
                    continue
                self._add(job, 1, step)
            elif kv.blocks and ledger.upload_pending(job, now):
                deferred.append(job)
                continue
            elif job.num_pending > 1:
                n = min(job.num_pending, budget)
                # A new job may push lower-priority paused jobs out (that is what lets a short
                # arrival overtake long paused ones), once its chunk is sized below; a started
                # job growing by a block waits instead (the last resort keeps the oldest moving).
                fits = self._fit(job, n) > 0
                started_short = started_short or (job.started and not fits)
                if fits:
                    prefills.append(job)
                    if _whole(job):
                        self._promise(job)
                        self._sure.add(job.job_id)
                    elif blocks_for(job.num_tokens, bs) <= len(kv.blocks):
                        self._sure.add(job.job_id)
                elif strict and not job.started:
                    admission_closed = True
                elif space is not None and not job.started:
                    short = self._short(job, n)
                    room = kvp.new_job_room(displaceable, step.iteration_s, claimed)
                    if claimed + short <= room:
                        claimed += short
                        work = policy.remaining_work(job) if ratio > 0 else None
                        if work is not None:
                            # Now, before the walk batches the started jobs below it (then
                            # no victims; under load nearly all are: displacing after the
                            # walk freed blocks in 32 of 14,820 tries, and prompts over 2,000
                            # tokens waited longer for a first token with a store than without).
                            space.make(job, short, (), ratio * max(work, 1.0))
                        prefills.append(job)
                continue
            elif job.num_pending == 1:
                if kv.on_worker and kv.num_computed < len(kv.blocks) * bs:
                    # The common case, kept lean for long simulations: a decode whose next
                    # token fits the blocks it holds (what _add would do, minus the
                    # allocation and first-schedule bookkeeping it cannot need).
                    commands.append(Command(job.job_id, 1, [], kv.num_computed + 1, True))
                    plan.num_batched_tokens += 1
                    job.last_scheduled_time = now
                elif self._fit(job, 1) > 0 or self._grow_room(job, space):
                    self._add(job, 1, step)
                else:
                    started_short = True
                    continue
            else:
                continue
            chosen.add(job.job_id)
            budget -= 1
        if deferred and not commands and not prefills:
            for job in deferred[:max_batch]:
                if job.num_pending > 1:
                    prefills.append(job)
                elif self._fit(job, 1) > 0:
                    self._add(job, 1, step)
                    chosen.add(job.job_id)
                    budget -= 1
        in_prefill = {j.job_id for j in prefills}
        for job in prefills:
            self._promised -= self._promises.pop(job.job_id, 0)
            n = self._fit(job, min(job.num_pending, budget))
            if n == 0 and budget > 0 and space is not None and not job.started and not strict:
                space.make(job, self._short(job, budget), in_prefill)
                n = self._fit(job, min(job.num_pending, budget))
            if n > 0:
                self._add(job, n, step)
                chosen.add(job.job_id)
                budget -= n
        # A new job that must displace paused jobs may get no room (its victims can end up in
        # the batch): the prefills the trim dropped behind it take its tokens and slots, in walk
        # order. Without this, Steps computed no prompt token (`predictive` with a store: five
        # starving new jobs short of room, five started jobs mid-prefill dropped behind them).
        for job in self._trimmed:
            if budget <= 0 or len(commands) >= max_batch:
                break
            n = self._fit(job, min(job.num_pending, budget))
            if n > 0:
                self._add(job, n, step)
                chosen.add(job.job_id)
                budget -= n
        step.passed = (skip.passed if skip is not None else 0) + unfed
        # No Step can make room by displacement (not only this one: a store coming back up
        # would let new jobs push paused KV out).
        step.passes_hold = (skip is not None and not kvp.drops
                            and not (kvp.swaps and ledger.store_blocks))
        self.reserve.observe(started_short and len(commands) < max_batch
                             and policy.arrivals_preempt, step.iterations)
        plan.commands = sorted(commands, key=lambda c: rank[c.job_id])  # priority order
        if not plan.commands:
            self._make_room(policy.order(now), budget, step)
        else:
            kvp.after_batch(step)

    def _floor(self, budget: int, all_started_seen: bool, prefills: list[Job],
               space: Displacement | None, displaceable: int, claimed: int,
               step: StepContext) -> int:
        """Tokens above which a new job's whole prompt (plus one) can neither start nor
        claim room by displacement where the walk stands (``WalkSkip``): ``_fit`` and the
        displacement branch of ``form``, solved for the job's need. ``NEVER`` where the next
        job's visit could end the walk (the checks at the top of ``form``'s loop); ``ALWAYS``
        (pass every new job but a one-token prompt) once prefills cover the budget (``unfed``)."""
        if budget <= 0:
            return NEVER
        if self._sure and self._covers(prefills, budget):
            return NEVER if all_started_seen else ALWAYS
        ledger = self.ledger
        blocks = (ledger.num_free - ledger.num_reserved() - self._promised
                  - (self.start_reserve if ledger.holding else 0))
        if space is not None:
            blocks += max(0, self.kv_policy.new_job_room(displaceable, step.iteration_s,
                                                         claimed) - claimed)
        return blocks * ledger.block_size

    def _grow_room(self, job: Job, space: Displacement | None) -> bool:
        """A started job at a block boundary finds none free: a lower-priority paused job
        makes room for it (reactive and recompute; the proactive planner keeps a block per
        batch job free ahead of time instead). Offloaded blocks are free from the next Step,
        dropped ones at once. Whether the job can grow now."""
        if space is None or not job.started or self.kv_policy.plans_ahead:
            return False
        space.make(job, 1, ())
        return self._fit(job, 1) > 0

    def _trim(self, prefills: list[Job], budget: int) -> bool:
        """The batch's slots are taken: drop the prefills that the tokens left after the
        decodes cannot reach (chunks are sized in walk order), so that their slots go to jobs
        further down the walk. Whether any was dropped."""
        left, keep = budget, 0
        for job in prefills:
            if left <= 0:
                break
            left -= min(job.num_pending, left)
            keep += 1
        for job in prefills[keep:]:
            self._promised -= self._promises.pop(job.job_id, 0)
        self._trimmed.extend(prefills[keep:])
        dropped = len(prefills) > keep
        del prefills[keep:]
        return dropped

    def _covers(self, prefills: list[Job], budget: int) -> bool:
        """Whether the prefills sure of their blocks take every token of ``budget`` (chunks
        are sized in walk order)."""
        sure = self._sure
        for job in prefills:
            if job.job_id in sure:
                budget -= job.num_pending
                if budget <= 0:
                    return True
        return False

    def _promise(self, job: Job) -> None:
        """Hold a new job's prompt blocks for it until its chunk is sized in this Step."""
        n = blocks_for(job.num_tokens + 1, self.ledger.block_size)
        self._promises[job.job_id] = n
        self._promised += n

    def _short(self, job: Job, n: int) -> int:
        """Free blocks ``job`` lacks to compute ``n`` tokens (new jobs: with the start reserve)."""
        ledger = self.ledger
        if _whole(job):
            need = self._start_need(job)
        else:
            need = blocks_for(job.kv.num_computed + n, ledger.block_size) - len(job.kv.blocks)
        return max(need - ledger.free_for(job), 0)

    def _start_need(self, job: Job) -> int:
        """Free blocks a job with no KV (new, or dropped) needs to start: its whole context
        and first token, the start reserve while any job holds KV (the reserve is for started
        jobs to grow into; with none, a prompt as long as the pool may use it all), and the
        blocks promised to the new jobs walked before it."""
        ledger = self.ledger
        reserve = self.start_reserve if ledger.holding else 0
        reserve += self._promised - self._promises.get(job.job_id, 0)
        return blocks_for(job.num_tokens + 1, ledger.block_size) + reserve

    def _fit(self, job: Job, n: int, whole: bool = True) -> int:
        """How many of ``n`` tokens ``job`` can compute given free blocks (0 = it waits).

        A job starts only when blocks for its whole prompt (and its first token) are free above
        the watermark, and they are reserved at once: jobs that cannot finish their prefill
        never pile up half-computed, and running jobs can still grow. So does a started job
        whose KV was dropped (it used to take what was free chunk by chunk, and such jobs
        filled the device half-computed until the last resort dropped them again: 986 of
        1,802 recomputes under overload). The last resort itself (``whole=False``) takes
        blocks chunk by chunk.
        """
        if n <= 0:
            return 0
        ledger = self.ledger
        if whole and _whole(job):
            return n if self._start_need(job) <= ledger.free_for(job) else 0
        bs = ledger.block_size
        kv = job.kv
        need = blocks_for(kv.num_computed + n, bs) - len(kv.blocks)
        if need > ledger.num_free:
            n = (len(kv.blocks) + ledger.num_free) * bs - kv.num_computed
            if n <= 0 or job.num_pending == 1:
                return 0
        return n

    def _add(self, job: Job, n: int, step: StepContext, whole: bool = True) -> None:
        """Put ``job`` in the batch for ``n`` tokens, with the blocks they need (for its
        whole context at once when it has none, unless ``whole`` is off)."""
        kv, plan, now = job.kv, step.plan, step.now
        tokens = (max(n, job.num_tokens + 1) if whole and _whole(job)
                  else kv.num_computed + n)
        need = blocks_for(tokens, self.ledger.block_size) - len(kv.blocks)
        new_blocks = self.ledger.grow(job, max(need, 0))
        done = kv.num_computed + n
        samples = done == job.num_tokens
        if kv.on_worker:
            plan.commands.append(Command(job.job_id, n, new_blocks, done, samples))
        else:
            plan.new_jobs.append(NewJobSpec(job.job_id, job.prompt, list(job.output),
                                            job.sampling, list(kv.blocks)))
            plan.commands.append(Command(job.job_id, n, [], done, samples))
            kv.on_worker = True
        if job.first_scheduled_time is None:
            step.started.append(job)
            step.policy.on_start(job)
            job.first_scheduled_time = now
            job.status = JobStatus.RUNNING
        job.last_scheduled_time = now
        plan.num_batched_tokens += n

    def _make_room(self, order: Iterable[Job], budget: int, step: StepContext) -> None:
        """Nothing fits: the oldest started job takes blocks from the newest ones (offloaded
        when the store has room, else their KV is dropped and recomputed later), vLLM-style.

        Only here, when the batch would otherwise be empty, so a job holding blocks keeps
        running while others wait; and by age, not by the policy's (changing) priorities, so
        the oldest job never loses its KV and always progresses (no eviction cycles).
        """
        busy = step.busy
        started = [j for j in order
                   if j.started and j.num_pending > 0 and j.job_id not in busy]
        if not started:
            return
        def age(j: Job) -> tuple[float, int]:
            return (j.arrival_time, j.job_id)

        oldest = min(started, key=age)
        ledger, plan = self.ledger, step.plan
        victims = sorted((j for j in ledger.holding.values()
                          if j is not oldest and j.job_id not in busy), key=age, reverse=True)
        n = min(oldest.num_pending, budget)
        bs = ledger.block_size
        need = blocks_for(oldest.kv.num_computed + n, bs) - len(oldest.kv.blocks)
        # Offloaded blocks are free from the next Step on: they count towards the need now
        # (evicting until the free count alone covered it offloaded every holder: seen as 34
        # jobs, the whole device, moved out for one job of 406 blocks), and they are reserved
        # for the oldest job then, so the next Step's walk cannot upload higher-priority jobs
        # into them (it did, leaving nothing that could run, and this moved them all out again
        # in every Step, the clock standing still).
        freeing = 0
        for victim in victims:
            if need <= ledger.num_free + freeing:
                break
            blocks = len(victim.kv.blocks)
            if self.kv_policy.evict(victim, plan, drop_ok=True) and victim.kv.stored:
                freeing += blocks
        if freeing and need > ledger.num_free:
            ledger.claim(oldest, min(need, ledger.num_free + freeing))
        if oldest.kv.stored:
            if (ledger.moved(oldest, plan)
                    or blocks_for(oldest.kv.num_computed + n, bs) > ledger.num_free):
                return
            ledger.swap_in(oldest, plan)
        n = self._fit(oldest, n, whole=False)
        if n > 0:
            self._add(oldest, n, step, whole=False)
            step.chosen.add(oldest.job_id)


def _whole(job: Job) -> bool:
    """A job with no KV anywhere (new, or dropped): it starts on blocks for its whole context."""
    kv = job.kv
    return not kv.blocks and kv.num_computed == 0 and not kv.stored
