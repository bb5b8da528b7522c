"""The scheduling core of one worker group: ``schedule(now) -> StepPlan``, then
``update(plan, result, now)``, once per iteration.

Block ownership, the invariant everything else leans on:

| job state                     | blocks held (scheduler)       | worker knows the job |
|-------------------------------|-------------------------------|----------------------|
| waiting, never scheduled      | none                          | no                   |
| scheduled                     | ceil(computed or in-flight / block_size) | yes       |
| offloaded to the KV store     | none; ``job.stored`` in store | yes (tokens, RNG)    |
| preempted by recompute        | none                          | no (freed)           |
| finished / cancelled / failed | none (returned at once)       | freed in next Step   |

Blocks returned while a Step is in flight are safe to reuse in the next Step because the
worker applies ``free_job_ids`` before ``new_jobs`` and ``commands``; blocks of a job swapped
out are reusable in the very Step that swaps it out, because the worker lets nothing write a
block before the swap-out reading it is done.

KV memory (FastServe section 3; ``config.kv_policy``): paused jobs keep their KV on the device
until a higher-priority job needs the blocks (``reactive``, ``recompute``), or until the
planner moves it to the node's KV store ahead of need (``proactive``: after the batch is
formed, offload the paused jobs with the largest Estimated Next Scheduled Time while free
blocks are under the headroom, and upload the offloaded jobs whose ENST is within two
iterations, so their copy overlaps this iteration's compute). ``defer`` never moves KV. When
the store is full, new jobs wait rather than push anyone out; a started job that cannot run
drops the KV of the lowest-priority paused job as a last resort.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler_svc.core.blocks import BlockAllocator, blocks_for
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job, JobStatus
from scheduler_svc.core.policy import Policy, make_policy

# After the store refuses a swap-out (full, or gone), KV stays where it is for this long.
STORE_RETRY_S = 1.0


@dataclass
class NewJobSpec:
    job_id: int
    prompt: list[int]
    output: list[int]
    job: Job
    block_ids: list[int]


@dataclass
class Command:
    job_id: int
    num_tokens: int
    append_block_ids: list[int]


@dataclass
class SwapIn:
    job_id: int
    block_ids: list[int]  # the job's new block table: blocks_for(num_computed) blocks
    stored: int = 0  # store blocks the upload releases once confirmed


@dataclass
class StepPlan:
    """One iteration for the worker: wire-independent, lists of ints."""

    new_jobs: list[NewJobSpec] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    free_job_ids: list[int] = field(default_factory=list)
    swap_out: list[int] = field(default_factory=list)  # job ids
    swap_in: list[SwapIn] = field(default_factory=list)
    batch: list[Job] = field(default_factory=list)  # batch[i] is the job of commands[i]
    num_batched_tokens: int = 0


@dataclass
class TokenResult:
    job_id: int
    num_computed: int
    token_id: int | None = None
    logprob: float | None = None


@dataclass
class StepResult:
    results: list[TokenResult] = field(default_factory=list)
    errors: list[tuple[int, str]] = field(default_factory=list)  # (job_id, message)
    compute_time_s: float = 0.0
    # Jobs whose KV the worker lost (a swap failed) and forgot: recomputed, not failed.
    kv_lost: list[int] = field(default_factory=list)
    # Swap-outs the worker refused (store full or unreachable): the job stays on the device.
    swap_refused: list[int] = field(default_factory=list)
    # Time this iteration waited for its own jobs' swaps.
    swap_wait_s: float = 0.0


@dataclass
class JobUpdate:
    """What one iteration changed for one job, for streaming to its client."""

    job: Job
    token_ids: list[int]
    logprobs: list[float]
    finished: bool


@dataclass
class Stats:
    policy: str
    queues: list[tuple[str, int]]
    num_running: int
    num_waiting: int
    num_blocks: int
    num_used_blocks: int
    num_iterations: int
    num_preemptions: int  # a job that ran in one iteration left out of the next, unfinished
    num_recomputes: int  # a job whose KV was dropped to make room, to be recomputed
    num_demotions: int
    num_promotions: int
    num_finished: dict[str, int]
    kv_policy: str = ""
    store_blocks: int = 0  # the KV store's capacity for this worker group (0: no store)
    store_used_blocks: int = 0
    num_offloaded: int = 0  # live jobs whose KV is in the store
    num_swap_outs: int = 0
    num_swap_ins: int = 0
    num_kv_lost: int = 0  # swaps that failed on the worker (the job was recomputed)
    swap_wait_s: float = 0.0


class _Space:
    """The lower-priority paused jobs whose blocks a job that does not fit may take.

    Candidates are the jobs holding device blocks that rank below the job asking in this
    Step's priority walk (or that it has not reached), outside the batch, largest ENST first.
    Built on first use,
    at most once per Step; a request larger than everything evictable marks that size as
    hopeless for the rest of the Step, so a long queue of jobs that cannot fit costs little.
    """

    def __init__(self, core: SchedulerCore, now: float, plan: StepPlan, seen: dict[int, int]):
        self.core = core
        self.now = now
        self.plan = plan
        self.seen = seen
        self._victims: list[Job] | None = None
        self._enst: dict[int, float] = {}
        self._hopeless = float("inf")

    def make(self, job: Job, short: int, chosen: set[int], keep: Iterable[int]) -> None:
        """Evict until ``short`` more blocks are free, or evict nothing if that cannot be done.

        Victims go to the store when the policy swaps; only the recompute policy drops their
        KV. With the store full, nobody is displaced: new prefills and reactive uploads wait
        (the last resort in ``_make_room`` keeps the oldest job moving).
        """
        core = self.core
        if short <= 0 or short >= self._hopeless:
            return
        if self._victims is None:
            self._enst = core.policy.enst(self.now, core._batch_estimate(),
                                          core._last_iteration_s)
            self._victims = sorted(core._holding.values(),
                                   key=lambda j: self._enst.get(j.job_id, 0.0), reverse=True)
        swaps = core._swapping()
        drops = core.config.kv_policy == "recompute"
        rank = self.seen[job.job_id]
        self._victims = [v for v in self._victims
                         if v.blocks and self.seen.get(v.job_id, rank + 1) > rank]
        picked, total, room = [], 0, core._store_free()
        for v in self._victims:
            if v.job_id in chosen or v.job_id in keep:
                continue
            # An offload pays when the victim's round trip is over before it runs again.
            if (swaps and core._swappable(v) and len(v.blocks) <= room
                    and self._enst.get(v.job_id, 0.0) > 2 * core._swap_seconds(len(v.blocks))):
                room -= len(v.blocks)
            elif not drops:
                continue
            picked.append(v)
            total += len(v.blocks)
            if total >= short:
                break
        if total < short:
            self._hopeless = short
            return
        offloaded = 0
        for v in picked:
            n = len(v.blocks)
            if core._evict(v, self.plan, drop_ok=drops) and v.stored:
                offloaded += n
        if offloaded and not job.started:
            core._claims[job.job_id] = core._claims.get(job.job_id, 0) + offloaded
        if self.plan.swap_out:
            # Offloaded blocks are reusable from the next Step on (see _swap_out): the job
            # asking starts then, and nobody else evicts for blocks already on their way.
            self._hopeless = 0


class SchedulerCore:
    """Jobs, blocks and batches for one worker group. Single-threaded: the loop owns it."""

    def __init__(self, config: SchedulerConfig, num_blocks: int, block_size: int,
                 max_context: int, policy: Policy | None = None,
                 cost_model: CostModel | None = None, store_blocks: int = 0):
        self.config = config
        self.max_context = max_context
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.cost_model = cost_model
        self.policy = policy or make_policy(config, cost_model)
        self.jobs: dict[int, Job] = {}
        self._pending_frees: list[int] = []
        self._num_waiting = 0  # live jobs never scheduled
        self._watermark_blocks = int(config.watermark * num_blocks)
        self.num_iterations = 0
        self.num_preemptions = 0
        self.num_recomputes = 0
        self._last_batch: set[int] = set()
        self.num_finished: dict[str, int] = {}
        # KV store accounting: capacity and blocks held there (including uploads in flight,
        # released when their Step's result confirms them).
        self.store_blocks = store_blocks
        self.store_used = 0
        self._offloaded: dict[int, Job] = {}
        self._holding: dict[int, Job] = {}  # live jobs holding device blocks
        self._outgoing: dict[int, list[int]] = {}  # swapped out, blocks not yet confirmed free
        # A refused swap-out means the store is full or gone: no swaps until this time.
        self._store_retry_at = 0.0
        self._store_up = store_blocks > 0
        self._arrivals: deque[tuple[float, int]] = deque()  # (time, prompt blocks)
        self._last_iteration_s = cost_model.min_iteration_time if cost_model else 0.05
        self.num_swap_outs = 0
        self.num_swap_ins = 0
        # Predicted time the worker's copy engine finishes the swaps issued so far (swaps are
        # priced by the cost model; without a price this stays in the past).
        self._now = 0.0
        self._copy_busy_until = 0.0
        # Blocks a new job's offloads free for it: reserved for that job in the next Step, so
        # a job walked earlier cannot take them and leave it to displace others again.
        self._claims: dict[int, int] = {}
        self._reserved: dict[int, int] = {}  # this Step's claims
        self.num_kv_lost = 0
        self.swap_wait_s = 0.0

    # ---- admission and termination -------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def num_running(self) -> int:
        return len(self.jobs) - self.num_waiting

    def can_admit(self) -> bool:
        return self.num_waiting < self.config.max_waiting

    def add(self, job: Job, now: float) -> None:
        assert job.job_id not in self.jobs, f"duplicate job id {job.job_id}"
        assert job.num_tokens < self.max_context
        self.jobs[job.job_id] = job
        self._num_waiting += not job.started
        self.policy.add(job, now)
        arrivals = self._arrivals
        arrivals.append((now, blocks_for(job.num_tokens + 1, self.allocator.block_size)))
        while arrivals[0][0] < now - self.config.kv_headroom_window_s:
            arrivals.popleft()

    def finish(self, job: Job, status: JobStatus, now: float, error: str = "") -> None:
        """End a live job: release its blocks now and free it on the worker next Step."""
        assert status.finished
        if job.status.finished:
            return
        self._num_waiting -= not job.started
        job.status = status
        job.finish_time = now
        job.error = error
        self._release(job)
        self._unstore(job)  # the worker frees its store handles with the job
        if job.on_worker:
            self._pending_frees.append(job.job_id)
            job.on_worker = False
        self.policy.remove(job)
        del self.jobs[job.job_id]
        reason = job.finish_reason or "error"
        self.num_finished[reason] = self.num_finished.get(reason, 0) + 1

    def cancel(self, job_id: int, now: float) -> Job | None:
        job = self.jobs.get(job_id)
        if job is not None:
            self.finish(job, JobStatus.CANCELLED, now)
        return job

    def fail_all(self, error: str, now: float) -> list[Job]:
        """The worker is gone: every live job fails; nothing is left to free on it."""
        failed = list(self.jobs.values())
        for job in failed:
            job.on_worker = False
            job.worker_lost = True
            self.finish(job, JobStatus.FAILED, now, error)
        self._pending_frees.clear()
        for blocks in self._outgoing.values():  # a Step that never answered
            self.allocator.free(blocks)
        self._outgoing.clear()
        return failed

    # ---- one iteration -------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.jobs) or bool(self._pending_frees)

    def schedule(self, now: float) -> StepPlan | None:
        """The next iteration's plan, or None when there is nothing to send."""
        plan = StepPlan(free_job_ids=self._pending_frees)
        self._pending_frees = []
        self._now = now
        self._reserved, self._claims = self._claims, {}
        self._store_up = self.store_blocks > 0 and now >= self._store_retry_at
        order = self.policy.order(now)
        chosen: set[int] = set()
        budget = self.config.max_batched_tokens
        holders_seen = 0
        free = self.allocator.num_free
        # Once every job holding blocks has been seen, the rest can only run on free blocks:
        # stop there if none can take them (a long queue then costs nothing per iteration).
        evicted = len(self.jobs) - self._num_waiting - len(self._holding)
        stuck = free == 0 or (free <= self._watermark_blocks and evicted == 0)
        # The batch is the highest-priority jobs that fit, up to max_batch_size. Decodes join
        # at once; prefill chunks are sized afterwards from the token budget the decodes left,
        # so a long prompt's prefill never pushes a higher-priority decode out of the batch.
        prefills: list[Job] = []
        rank: dict[int, int] = {}
        bs = self.allocator.block_size
        space = _Space(self, now, plan, rank) if self._may_evict() else None
        # A new job that must displace paused jobs takes a batch slot only while the blocks of
        # the holders behind it (and, when swapping, the store's room) can cover every such
        # job so far: otherwise jobs that cannot start would fill the batch's slots and stop
        # the walk before the paused jobs that could run.
        displaceable = self.allocator.num_used - sum(len(b) for b in self._outgoing.values())
        claimed = 0
        # Under a policy whose arrivals never outrank started jobs (FCFS, RTC) and a KV policy
        # that moves or drops KV, admission is in order, as in vLLM: once a new job does not
        # fit, the new jobs behind it wait too, and no new job displaces a started one.
        # Otherwise younger jobs take the blocks the older one waits for, and it displaces
        # them mid-decode (measured: 8,000 offloads for 1,000 requests, 12x the mean JCT).
        # Under defer nothing is displaced, so a job that fits may go ahead of one that waits.
        strict = not self.policy.arrivals_preempt and self.config.kv_policy != "defer"
        admission_closed = False
        for job in order:
            if len(plan.batch) + len(prefills) >= self.config.max_batch_size or budget <= 0:
                break
            rank[job.job_id] = len(rank)
            if job.blocks:
                holders_seen += 1
                displaceable -= len(job.blocks)
            elif stuck and holders_seen == len(self._holding):
                break
            if job.stored:  # offloaded: swapped in now, in the Step that runs it
                n = 1 if job.num_pending == 1 else min(job.num_pending, budget)
                need = blocks_for(job.num_computed + n, bs)
                # Reactive swapping makes room here, on the critical path; the proactive
                # planner makes its exchanges ahead of time, by ENST, and only fills free
                # blocks here.
                if (need > self.allocator.num_free and space is not None
                        and self.config.kv_policy != "proactive"):
                    space.make(job, need - self.allocator.num_free, chosen, ())
                if need > self._free_for(job):
                    continue
                self._swap_in(job, plan)
                if job.num_pending > 1:
                    prefills.append(job)
                    continue
                self._add_to_plan(job, 1, plan, now)
            elif job.num_pending > 1:
                n = min(job.num_pending, budget)
                # A new job may push lower-priority paused jobs out (that is what lets a short
                # arrival overtake long paused ones), once its chunk is sized below; a started
                # job growing by a block waits instead (the last resort keeps the oldest moving).
                if admission_closed and not job.started:
                    continue
                if self._fit_blocks(job, n) > 0:
                    prefills.append(job)
                elif strict and not job.started:
                    admission_closed = True
                elif space is not None and not job.started:
                    short = self._blocks_short(job, n)
                    if self.config.kv_policy == "recompute":
                        room = displaceable
                    elif self._copy_backlog() <= 2 * self._last_iteration_s:
                        room = min(displaceable, self._store_free())
                    else:
                        room = 0  # the copy engine is busy: no displacement this Step
                    if claimed + short <= room:
                        claimed += short
                        prefills.append(job)
                continue
            elif job.num_pending == 1:
                if job.on_worker and job.num_computed < len(job.blocks) * bs:
                    # The common case, kept lean for long simulations: a decode whose next
                    # token fits the blocks it holds (what _add_to_plan would do, minus the
                    # allocation and first-schedule bookkeeping it cannot need).
                    plan.commands.append(Command(job.job_id, 1, []))
                    plan.batch.append(job)
                    plan.num_batched_tokens += 1
                    job.last_scheduled_time = now
                elif self._fit_blocks(job, 1) > 0:
                    self._add_to_plan(job, 1, plan, now)
                else:
                    continue
            else:
                continue
            chosen.add(job.job_id)
            budget -= 1
        in_prefill = {j.job_id for j in prefills}
        for job in prefills:
            n = self._fit_blocks(job, min(job.num_pending, budget))
            if n == 0 and budget > 0 and space is not None and not job.started and not strict:
                space.make(job, self._blocks_short(job, budget), chosen, in_prefill)
                n = self._fit_blocks(job, min(job.num_pending, budget))
            if n > 0:
                self._add_to_plan(job, n, plan, now)
                chosen.add(job.job_id)
                budget -= n
        # Priority order (for the policy's head return); commands stay paired with the batch.
        pairs = sorted(zip(plan.commands, plan.batch), key=lambda cj: rank[cj[1].job_id])
        plan.commands = [c for c, _ in pairs]
        plan.batch = [j for _, j in pairs]
        if not plan.batch:
            self._make_room(self.policy.order(now), budget, plan, now, chosen)
        elif self.config.kv_policy == "proactive" and self._store_up:
            self._plan_memory(now, plan, chosen)
        self.num_preemptions += sum(1 for j in self._last_batch
                                    if j not in chosen and j in self.jobs)
        self._last_batch = chosen
        self._reserved = {}
        if not (plan.batch or plan.free_job_ids or plan.swap_out or plan.swap_in):
            return None
        return plan

    def _free_for(self, job: Job) -> int:
        """Free blocks ``job`` may take: all but those reserved for other jobs this Step."""
        return self.allocator.num_free - sum(n for jid, n in self._reserved.items()
                                             if jid != job.job_id)

    def _may_evict(self) -> bool:
        """Whether a job that does not fit may take a lower-priority paused job's blocks."""
        return self.config.kv_policy == "recompute" or self._swapping()

    def _swapping(self) -> bool:
        """Whether paused jobs' KV moves to the store now (a swapping policy, the store up)."""
        return self.config.kv_policy in ("reactive", "proactive") and self._store_up

    def _blocks_short(self, job: Job, n: int) -> int:
        """Free blocks ``job`` lacks to compute ``n`` tokens (new jobs: with the watermark)."""
        if not job.started:
            reserve = self._watermark_blocks if self._holding else 0
            need = blocks_for(job.num_tokens + 1, self.allocator.block_size) + reserve
        else:
            need = blocks_for(job.num_computed + n, self.allocator.block_size) - len(job.blocks)
        return max(need - self._free_for(job), 0)

    def _fit_blocks(self, job: Job, n: int) -> int:
        """How many of ``n`` tokens ``job`` can compute given free blocks (0 = it waits).

        A job starts only when blocks for its whole prompt (and its first token) are free above
        the watermark, and they are reserved at once: jobs that cannot finish their prefill
        never pile up half-computed, and running jobs can still grow. A started job that lost
        its KV takes what is free, chunk by chunk. A job that does not fit waits without
        blocking the jobs behind it.
        """
        if n <= 0:
            return 0
        if not job.started:
            need = blocks_for(job.num_tokens + 1, self.allocator.block_size)
            # The watermark is for running jobs to grow into; with none, a prompt as long as
            # the pool may use it all.
            reserve = self._watermark_blocks if self._holding else 0
            return n if need <= self._free_for(job) - reserve else 0
        bs = self.allocator.block_size
        need = blocks_for(job.num_computed + n, bs) - len(job.blocks)
        if need > self.allocator.num_free:
            n = (len(job.blocks) + self.allocator.num_free) * bs - job.num_computed
            if n <= 0 or job.num_pending == 1:
                return 0
        return n

    # ---- KV memory: offload, upload, drop -------------------------------------------------
    def _swappable(self, job: Job) -> bool:
        """A paused job whose blocks hold exactly its computed KV (the worker stores the table)."""
        return (job.on_worker and job.num_computed > 0
                and len(job.blocks) == blocks_for(job.num_computed, self.allocator.block_size))

    def _store_free(self) -> int:
        return self.store_blocks - self.store_used

    def _evict(self, victim: Job, plan: StepPlan, drop_ok: bool) -> bool:
        """Free ``victim``'s device blocks: offload when the policy swaps and the store has
        room, else drop its KV when ``drop_ok``. Whether its blocks were freed."""
        if (self._swapping() and self._swappable(victim)
                and len(victim.blocks) <= self._store_free()):
            self._swap_out(victim, plan)
            return True
        if self.config.kv_policy == "recompute" or drop_ok:
            self._preempt(victim, plan)
            return True
        return False

    def _swap_out(self, job: Job, plan: StepPlan) -> None:
        """Offload ``job``. Its blocks are reused only after the Step's result confirms the
        offload: a worker whose store refuses it (full, or gone) keeps the job on the device,
        and the job then keeps its blocks here too."""
        n = len(job.blocks)
        self._outgoing[job.job_id] = job.blocks
        del self._holding[job.job_id]
        job.blocks = []
        job.stored = n
        job.num_offloads += 1
        self.store_used += n
        self._offloaded[job.job_id] = job
        self.num_swap_outs += 1
        plan.swap_out.append(job.job_id)
        self._queue_copy(n)

    def _swap_in(self, job: Job, plan: StepPlan) -> None:
        """Give an offloaded job device blocks for its KV; the store copy is released when the
        Step's result confirms the upload (until then it still occupies the store)."""
        n = blocks_for(job.num_computed, self.allocator.block_size)
        blocks = self.allocator.allocate(n)
        self._hold(job, blocks)
        plan.swap_in.append(SwapIn(job.job_id, list(blocks), job.stored))
        del self._offloaded[job.job_id]
        job.stored = 0
        self.num_swap_ins += 1
        self._queue_copy(n)

    def _queue_copy(self, num_blocks: int) -> None:
        self._copy_busy_until = (max(self._now, self._copy_busy_until)
                                 + self._swap_seconds(num_blocks))

    def _copy_backlog(self) -> float:
        """Seconds of swaps already queued on the worker's copy engine (predicted)."""
        return max(self._copy_busy_until - self._now, 0.0)

    def _unstore(self, job: Job) -> None:
        if job.stored:
            self.store_used -= job.stored
            job.stored = 0
            del self._offloaded[job.job_id]

    def _headroom(self, now: float) -> int:
        """Free blocks to keep for arrivals: the prompts of the last headroom window."""
        if not self.policy.arrivals_preempt:
            return 0  # arrivals queue behind every started job: nothing to keep for them
        arrivals = self._arrivals
        horizon = now - self.config.kv_headroom_window_s
        while arrivals and arrivals[0][0] < horizon:
            arrivals.popleft()
        cap = int(self.config.kv_headroom_max * self.allocator.num_blocks)
        return min(sum(b for _, b in arrivals), cap)

    def _plan_memory(self, now: float, plan: StepPlan, chosen: set[int]) -> None:
        """Proactive offload and upload by ENST, issued one iteration ahead of need."""
        headroom = self._headroom(now)
        if not self._offloaded and self.allocator.num_free >= headroom:
            return
        iteration_s = self._last_iteration_s
        enst = self.policy.enst(now, self._batch_estimate(), iteration_s)
        soon = 2.0 * iteration_s  # uploads start this far ahead (the copy overlaps this Step)
        # Offload only jobs that will not run for a while: a job moved out and straight back
        # costs two copies and gains nothing. With a cost model that prices swaps, "a while"
        # also covers the round trip of the job's own KV.
        later = 4.0 * soon
        swap_s = self._swap_seconds
        busy = chosen | set(plan.swap_out)
        # Paused device jobs, largest ENST first: the ones to offload.
        paused = sorted((j for j in self._holding.values()
                         if j.job_id not in busy and self._swappable(j)),
                        key=lambda j: enst.get(j.job_id, 0.0), reverse=True)
        bs = self.allocator.block_size
        # Blocks of this Step's offloads: free from the next Step on (see _swap_out).
        freeing = sum(len(self._outgoing[jid]) for jid in plan.swap_out)

        def offload_ok(victim: Job, after: float) -> bool:
            # It runs after ``after`` and its round trip, the store can take it, and the copy
            # engine is not already busy past the next iterations (offloads queued beyond that
            # only delay the uploads behind them).
            return (enst.get(victim.job_id, 0.0) > after + 2 * swap_s(len(victim.blocks))
                    and len(victim.blocks) <= self._store_free()
                    and self._copy_backlog() <= soon)

        for job in sorted(self._offloaded.values(), key=lambda j: enst.get(j.job_id, 0.0)):
            if job.job_id in busy:
                continue  # offloaded in this very Step: not back before the result confirms it
            t = enst.get(job.job_id, float("inf"))
            if t > soon + swap_s(job.stored):
                continue
            need = blocks_for(job.num_computed + 1, bs)
            # Make room by offloading paused jobs that will run later than this one.
            free = self.allocator.num_free - sum(self._reserved.values())
            while free + freeing < need and paused:
                if not offload_ok(paused[0], max(t, later)):
                    break
                victim = paused.pop(0)
                freeing += len(victim.blocks)
                self._swap_out(victim, plan)
            if free < need:
                break  # room is on its way (or cannot be made): upload from a later Step
            self._swap_in(job, plan)
            busy.add(job.job_id)
        # Restore the headroom with the paused jobs that will not run soon.
        for victim in paused:
            if self.allocator.num_free + freeing >= headroom:
                break
            if offload_ok(victim, later):
                freeing += len(victim.blocks)
                self._swap_out(victim, plan)

    def _batch_estimate(self) -> int:
        """Jobs per iteration for ENST: the last batch's size (memory can bound it far below
        max_batch_size), at least 1."""
        return max(1, min(self.config.max_batch_size, len(self._last_batch)))

    def _swap_seconds(self, num_blocks: int) -> float:
        """Predicted one-way copy time of ``num_blocks`` blocks (0 without a pricing model)."""
        if self.cost_model is None:
            return 0.0
        return self.cost_model.swap_time(num_blocks, self.allocator.block_size)

    def _make_room(self, order: Iterable[Job], budget: int, plan: StepPlan, now: float,
                   chosen: set[int]) -> None:
        """Nothing fits: the oldest started job takes blocks from the newest ones (offloaded
        when the store has room, else their KV is dropped and recomputed later), vLLM-style.

        Only here, when the batch would otherwise be empty, so a job holding blocks keeps
        running while others wait; and by age, not by the policy's (changing) priorities, so
        the oldest job never loses its KV and always progresses: jobs cannot evict each other
        in turn forever.
        """
        started = [j for j in order if j.started and j.num_pending > 0]
        if not started:
            return
        age = lambda j: (j.arrival_time, j.job_id)
        oldest = min(started, key=age)
        victims = sorted((j for j in self._holding.values() if j is not oldest),
                         key=age, reverse=True)
        n = min(oldest.num_pending, budget)
        bs = self.allocator.block_size
        need = blocks_for(oldest.num_computed + n, bs) - len(oldest.blocks)
        for victim in victims:
            if need <= self.allocator.num_free:
                break
            self._evict(victim, plan, drop_ok=True)
        if oldest.stored:
            if blocks_for(oldest.num_computed + n, bs) > self.allocator.num_free:
                return
            self._swap_in(oldest, plan)
        n = self._fit_blocks(oldest, n)
        if n > 0:
            self._add_to_plan(oldest, n, plan, now)
            chosen.add(oldest.job_id)

    def _hold(self, job: Job, blocks: list[int]) -> None:
        if blocks and not job.blocks:
            self._holding[job.job_id] = job
        job.blocks.extend(blocks)

    def _release(self, job: Job) -> None:
        if job.blocks:
            del self._holding[job.job_id]
        self.allocator.free(job.blocks)
        job.blocks = []

    def _preempt(self, victim: Job, plan: StepPlan) -> None:
        """Drop ``victim``'s KV: it is computed again from its prompt and output later."""
        self._release(victim)
        self._unstore(victim)
        victim.num_computed = 0
        victim.num_recomputes += 1
        self.num_recomputes += 1
        if victim.on_worker:
            plan.free_job_ids.append(victim.job_id)
            victim.on_worker = False

    def _add_to_plan(self, job: Job, n: int, plan: StepPlan, now: float) -> None:
        tokens = job.num_computed + n if job.started else max(job.num_computed + n,
                                                               job.num_tokens + 1)
        need = blocks_for(tokens, self.allocator.block_size) - len(job.blocks)
        new_blocks = self.allocator.allocate(max(need, 0))
        self._hold(job, new_blocks)
        if job.on_worker:
            plan.commands.append(Command(job.job_id, n, new_blocks))
        else:
            plan.new_jobs.append(NewJobSpec(job.job_id, job.prompt, list(job.output), job,
                                            list(job.blocks)))
            plan.commands.append(Command(job.job_id, n, []))
            job.on_worker = True
        self._reserved.pop(job.job_id, None)
        if job.first_scheduled_time is None:
            self._num_waiting -= 1
            job.first_scheduled_time = now
            job.status = JobStatus.RUNNING
        job.last_scheduled_time = now
        plan.batch.append(job)
        plan.num_batched_tokens += n

    def update(self, plan: StepPlan, result: StepResult, now: float) -> list[JobUpdate]:
        """Apply the worker's answer to ``plan``: append tokens, finish jobs, charge service."""
        self.num_iterations += 1
        if plan.batch and result.compute_time_s > 0:
            self._last_iteration_s = result.compute_time_s
        self.swap_wait_s += result.swap_wait_s
        for s in plan.swap_in:  # uploads done (or failed: then the worker freed the handles)
            self.store_used -= s.stored
        refused = set(result.swap_refused).intersection(plan.swap_out)
        for job_id in plan.swap_out:
            blocks = self._outgoing.pop(job_id)
            job = self.jobs.get(job_id)
            if job_id in refused:
                self._store_retry_at = now + STORE_RETRY_S
            if job_id in refused and job is not None and job.stored:
                self._unstore(job)  # still on the device, with its KV
                self._hold(job, blocks)
            else:
                self.allocator.free(blocks)
        for job_id in result.kv_lost:
            job = self.jobs.get(job_id)
            if job is not None:
                self._lose_kv(job)
        updates: list[JobUpdate] = []
        lost = set(result.kv_lost)
        for job_id, message in result.errors:
            # A refused swap-out leaves the job as it was; a job whose KV was lost was forgotten
            # by the worker, so its other entries in the same Step (a command after a failed
            # swap-in: NOT_FOUND) are explained by the loss and it is recomputed.
            if job_id in refused or job_id in lost:
                continue
            job = self.jobs.get(job_id)
            if job is not None:
                self.finish(job, JobStatus.FAILED, now, f"worker: {message}")
                updates.append(JobUpdate(job, [], [], True))
        for r in result.results:
            job = self.jobs.get(r.job_id)
            if job is None:  # cancelled while the step ran
                continue
            job.num_computed = r.num_computed
            if r.token_id is None:
                continue
            job.output.append(r.token_id)
            if job.first_token_time is None:
                job.first_token_time = now
            status = self._finish_status(job)
            if status is not None:
                self.finish(job, status, now)
            updates.append(JobUpdate(job, [r.token_id], [r.logprob or 0.0], job.status.finished))
        ran = [j for j in plan.batch if not j.status.finished]
        self.policy.on_iteration(ran, result.compute_time_s, now)
        return updates

    def _lose_kv(self, job: Job) -> None:
        """The worker lost this job's KV (a failed swap) and forgot the job: recompute it."""
        self.num_kv_lost += 1
        self._release(job)
        self._unstore(job)
        job.num_computed = 0
        job.on_worker = False
        job.num_recomputes += 1
        self.num_recomputes += 1

    def _finish_status(self, job: Job) -> JobStatus | None:
        if not job.ignore_eos and job.output[-1] in job.eos_token_ids:
            return JobStatus.FINISHED_STOPPED
        if len(job.output) >= job.max_tokens or job.num_tokens >= self.max_context:
            return JobStatus.FINISHED_LENGTH
        return None

    def stats(self) -> Stats:
        return Stats(
            policy=self.policy.name,
            queues=self.policy.queues(),
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            num_blocks=self.allocator.num_blocks,
            num_used_blocks=self.allocator.num_used,
            num_iterations=self.num_iterations,
            num_preemptions=self.num_preemptions,
            num_recomputes=self.num_recomputes,
            num_demotions=self.policy.num_demotions,
            num_promotions=self.policy.num_promotions,
            num_finished=dict(self.num_finished),
            kv_policy=self.config.kv_policy,
            store_blocks=self.store_blocks,
            store_used_blocks=self.store_used,
            num_offloaded=len(self._offloaded),
            num_swap_outs=self.num_swap_outs,
            num_swap_ins=self.num_swap_ins,
            num_kv_lost=self.num_kv_lost,
            swap_wait_s=self.swap_wait_s,
        )

    def check_invariants(self) -> None:
        """Free + held == total, and no block held twice (run when idle and in tests)."""
        assert self._num_waiting == sum(1 for j in self.jobs.values() if not j.started)
        assert set(self._holding) == {j.job_id for j in self.jobs.values() if j.blocks}
        assert set(self._offloaded) == {j.job_id for j in self.jobs.values() if j.stored}
        assert all(not j.blocks for j in self._offloaded.values()), "offloaded job holds blocks"
        assert self.store_used == sum(j.stored for j in self.jobs.values()), (
            f"store: {self.store_used} used != {sum(j.stored for j in self.jobs.values())} held"
        )
        assert 0 <= self.store_used <= self.store_blocks, f"store: {self.store_used} used"
        held = [b for j in self.jobs.values() for b in j.blocks]
        assert len(held) == len(set(held)), "a block is held by two jobs"
        held += [b for blocks in self._outgoing.values() for b in blocks]
        assert len(held) + self.allocator.num_free == self.allocator.num_blocks, (
            f"{len(held)} held + {self.allocator.num_free} free != {self.allocator.num_blocks}"
        )
