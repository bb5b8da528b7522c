"""The scheduling core of one worker group: ``schedule(now) -> StepPlan``, then
``update(plan, result, now)``, once per iteration.

Block ownership, the invariant everything else leans on:

| job state                     | blocks held (scheduler)       | worker knows the job |
|-------------------------------|-------------------------------|----------------------|
| waiting, never scheduled      | none                          | no                   |
| scheduled                     | ceil(computed or in-flight / block_size) | yes       |
| preempted by recompute        | none                          | no (freed)           |
| finished / cancelled / failed | none (returned at once)       | freed in next Step   |

Blocks returned while a Step is in flight are safe to reuse in the next Step because the
worker applies ``free_job_ids`` before ``new_jobs`` and ``commands``.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from scheduler_svc.core.blocks import BlockAllocator, blocks_for
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job, JobStatus
from scheduler_svc.core.policy import Policy, make_policy


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
class StepPlan:
    """One iteration for the worker: wire-independent, lists of ints."""

    new_jobs: list[NewJobSpec] = field(default_factory=list)
    commands: list[Command] = field(default_factory=list)
    free_job_ids: list[int] = field(default_factory=list)
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


class SchedulerCore:
    """Jobs, blocks and batches for one worker group. Single-threaded: the loop owns it."""

    def __init__(self, config: SchedulerConfig, num_blocks: int, block_size: int,
                 max_context: int, policy: Policy | None = None,
                 cost_model: CostModel | None = None):
        self.config = config
        self.max_context = max_context
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.cost_model = cost_model
        self.policy = policy or make_policy(config, cost_model)
        self.jobs: dict[int, Job] = {}
        self._pending_frees: list[int] = []
        self._num_waiting = 0  # live jobs never scheduled
        self._num_holders = 0  # live jobs holding blocks
        self._watermark_blocks = int(config.watermark * num_blocks)
        self.num_iterations = 0
        self.num_preemptions = 0
        self.num_recomputes = 0
        self._last_batch: set[int] = set()
        self.num_finished: dict[str, int] = {}

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
        return failed

    # ---- one iteration -------------------------------------------------------------------
    def has_work(self) -> bool:
        return bool(self.jobs) or bool(self._pending_frees)

    def schedule(self, now: float) -> StepPlan | None:
        """The next iteration's plan, or None when there is nothing to send."""
        plan = StepPlan(free_job_ids=self._pending_frees)
        self._pending_frees = []
        order = self.policy.order(now)
        chosen: set[int] = set()
        budget = self.config.max_batched_tokens
        holders_seen = 0
        free = self.allocator.num_free
        # Once every job holding blocks has been seen, the rest can only run on free blocks:
        # stop there if none can take them (a long queue then costs nothing per iteration).
        evicted = len(self.jobs) - self._num_waiting - self._num_holders
        stuck = free == 0 or (free <= self._watermark_blocks and evicted == 0)
        # The batch is the highest-priority jobs that fit, up to max_batch_size. Decodes join
        # at once; prefill chunks are sized afterwards from the token budget the decodes left,
        # so a long prompt's prefill never pushes a higher-priority decode out of the batch.
        prefills: list[Job] = []
        rank: dict[int, int] = {}
        bs = self.allocator.block_size
        for job in order:
            if len(plan.batch) + len(prefills) >= self.config.max_batch_size or budget <= 0:
                break
            rank[job.job_id] = len(rank)
            if job.blocks:
                holders_seen += 1
            elif stuck and holders_seen == self._num_holders:
                break
            if job.num_pending > 1:
                if self._fit_blocks(job, min(job.num_pending, budget)) > 0:
                    prefills.append(job)
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
                chosen.add(job.job_id)
                budget -= 1
        for job in prefills:
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
        self.num_preemptions += sum(1 for j in self._last_batch
                                    if j not in chosen and j in self.jobs)
        self._last_batch = chosen
        if not plan.batch and not plan.free_job_ids:
            return None
        return plan

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
            reserve = self._watermark_blocks if self._num_holders else 0
            return n if need <= self.allocator.num_free - reserve else 0
        bs = self.allocator.block_size
        need = blocks_for(job.num_computed + n, bs) - len(job.blocks)
        if need > self.allocator.num_free:
            n = (len(job.blocks) + self.allocator.num_free) * bs - job.num_computed
            if n <= 0 or job.num_pending == 1:
                return 0
        return n

    def _make_room(self, order: Iterable[Job], budget: int, plan: StepPlan, now: float,
                   chosen: set[int]) -> None:
        """Nothing fits: the oldest started job takes blocks from the newest ones (their KV is
        dropped and recomputed later), vLLM-style.

        Only here, when the batch would otherwise be empty, so a job holding blocks keeps
        running while others wait; and by age, not by the policy's (changing) priorities, so
        the oldest job never loses its KV and always progresses: jobs cannot evict each other
        in turn forever. Host-memory offloading (the KV store) replaces most of this.
        """
        started = [j for j in order if j.started and j.num_pending > 0]
        if not started:
            return
        age = lambda j: (j.arrival_time, j.job_id)
        oldest = min(started, key=age)
        victims = sorted((j for j in self.jobs.values() if j is not oldest and j.blocks),
                         key=age, reverse=True)
        n = min(oldest.num_pending, budget)
        self._evict_for(oldest, n, victims, plan)
        n = self._fit_blocks(oldest, n)
        if n > 0:
            self._add_to_plan(oldest, n, plan, now)
            chosen.add(oldest.job_id)

    def _evict_for(self, job: Job, n: int, victims: list[Job], plan: StepPlan) -> None:
        """Drop victims' KV, in the order given, until ``job`` has blocks for ``n`` tokens."""
        need = blocks_for(job.num_computed + n, self.allocator.block_size) - len(job.blocks)
        for victim in victims:
            if need <= self.allocator.num_free:
                return
            if victim.blocks:
                self._preempt(victim, plan)

    def _release(self, job: Job) -> None:
        self._num_holders -= bool(job.blocks)
        self.allocator.free(job.blocks)
        job.blocks = []

    def _preempt(self, victim: Job, plan: StepPlan) -> None:
        self._release(victim)
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
        self._num_holders += not job.blocks and bool(new_blocks)
        job.blocks.extend(new_blocks)
        if job.on_worker:
            plan.commands.append(Command(job.job_id, n, new_blocks))
        else:
            plan.new_jobs.append(NewJobSpec(job.job_id, job.prompt, list(job.output), job,
                                            list(job.blocks)))
            plan.commands.append(Command(job.job_id, n, []))
            job.on_worker = True
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
        updates: list[JobUpdate] = []
        for job_id, message in result.errors:
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
        )

    def check_invariants(self) -> None:
        """Free + held == total, and no block held twice (run when idle and in tests)."""
        assert self._num_waiting == sum(1 for j in self.jobs.values() if not j.started)
        assert self._num_holders == sum(1 for j in self.jobs.values() if j.blocks)
        held = [b for j in self.jobs.values() for b in j.blocks]
        assert len(held) == len(set(held)), "a block is held by two jobs"
        assert len(held) + self.allocator.num_free == self.allocator.num_blocks, (
            f"{len(held)} held + {self.allocator.num_free} free != {self.allocator.num_blocks}"
        )
