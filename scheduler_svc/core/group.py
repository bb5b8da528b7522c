"""The scheduling core of one worker group: admit and finish jobs, ``schedule(now)`` a plan,
``update(step_id, result, now)`` when its answer comes back.

Up to ``pipeline_depth`` plans may be in flight at once (a pipeline of P stages keeps P
batches moving); a job is in at most one of them. ``schedule()`` advances what it plans
(computed tokens, blocks) when it hands the plan out, as vLLM V1's scheduler does, and
``update()`` settles exactly the plan its ``step_id`` names, in any order; an unknown step id
is refused.

Blocks returned while a Step is in flight are safe to reuse in the next Step because the
worker runs Steps in order and applies ``free_job_ids`` before ``new_jobs`` and ``commands``;
blocks of a job swapped out are reusable once the Step that swaps it out has answered
(``kv/ledger.py``). Who holds which block is the ledger's; what happens to paused jobs' KV is
the KV policy's (``kv/policies.py``); the batch is the batcher's (``batcher.py``).
"""

from __future__ import annotations

from collections import deque

from scheduler_svc.core.batcher import Batcher
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import ArrivalProbe, JobUpdate, Stats, StepPlan, StepResult
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job, JobStatus, Placement
from scheduler_svc.core.kv.allocator import blocks_for
from scheduler_svc.core.kv.ledger import KVLedger
from scheduler_svc.core.kv.policies import make_kv_policy
from scheduler_svc.core.policies import Policy, make_policy
from scheduler_svc.core.policies.ranked import ALWAYS, NEVER, need
from scheduler_svc.core.steady import repeatable
from scheduler_svc.core.step_context import StepContext


class UnknownStep(ValueError):
    """A result for a step id that is not in flight."""


class GroupCore:
    """Jobs, blocks and batches for one worker group. Single-threaded: its loop owns it."""

    def __init__(self, config: SchedulerConfig, num_blocks: int, block_size: int,
                 max_context: int, policy: Policy | None = None,
                 cost_model: CostModel | None = None, store_blocks: int = 0,
                 pipeline_depth: int = 1):
        if pipeline_depth < 1:
            raise ValueError(f"pipeline_depth must be >= 1, got {pipeline_depth}")
        self.config = config
        self.max_context = max_context
        self.cost_model = cost_model
        self.pipeline_depth = pipeline_depth
        self.policy = policy or make_policy(config, cost_model)
        self.kv = KVLedger(num_blocks, block_size, store_blocks, cost_model)
        self.kv_policy = make_kv_policy(config, self.kv)
        self.batcher = Batcher(config, self.kv, self.kv_policy)
        self.jobs: dict[int, Job] = {}
        self._pending_frees: list[int] = []
        self._num_waiting = 0  # live jobs never scheduled
        self._num_waiting_single = 0  # of them, those with a one-token prompt
        self._waiting_prompt_tokens = 0  # their prompts' tokens, in all
        self.num_iterations = 0
        self.num_preemptions = 0
        self.num_finished: dict[str, int] = {}
        self._last_batch: set[int] = set()
        self._recent_batches: deque[set[int]] = deque(maxlen=pipeline_depth)
        self._last_iteration_s = cost_model.min_iteration_time if cost_model else 0.05
        self.swap_wait_s = 0.0
        self._next_step_id = 0
        self._in_flight: dict[int, StepPlan] = {}
        self._busy: set[int] = set()  # jobs in the plans in flight
        self.num_predicted = 0  # finished jobs with a first predicted length
        self._prediction_abs_error = 0.0  # summed |first prediction - output length|
        # The last plan, when it could repeat unchanged (``steady.py``), whether its walk
        # passed jobs only by need against free blocks (``StepContext.passes_hold``), the
        # jobs added since it was formed and the least need among them (``ranked.need``;
        # ``ALWAYS`` for a job that has run: the walk reads it).
        self.repeatable_plan: StepPlan | None = None
        self.passes_hold = False
        self.added_since_plan = 0
        self.added_least_need = NEVER
        self._moves_at_plan = 0  # the policy's demotions and promotions when it was formed
        # Estimates at arrival: on when the worker answers probes and the policy ranks by
        # predictions (its loop, or the simulator, says); the jobs not yet estimated, oldest first.
        self.arrival_probes = False
        self._to_probe: deque[Job] = deque()
        self.num_probes = 0

    # ---- admission and termination -------------------------------------------------------
    @property
    def num_waiting(self) -> int:
        return self._num_waiting

    @property
    def num_running(self) -> int:
        return len(self.jobs) - self._num_waiting

    @property
    def block_size(self) -> int:
        return self.kv.block_size

    def can_admit(self) -> bool:
        return self._num_waiting < self.config.max_waiting

    def add(self, job: Job, now: float) -> None:
        assert job.job_id not in self.jobs, f"duplicate job id {job.job_id}"
        assert job.num_tokens < self.max_context
        self.jobs[job.job_id] = job
        self.added_since_plan += 1
        self.added_least_need = min(self.added_least_need,
                                    ALWAYS if job.started else need(job))
        self._num_waiting += not job.started
        self._num_waiting_single += not job.started and len(job.prompt) == 1
        self._waiting_prompt_tokens += 0 if job.started else len(job.prompt)
        self.policy.add(job, now)
        self.kv_policy.on_arrival(job, now)
        if (self.arrival_probes and not job.started and not job.output
                and job.predicted_output_tokens is None and self.config.arrival_probe_tokens > 0):
            self._to_probe.append(job)

    def finish(self, job: Job, status: JobStatus, now: float, error: str = "") -> None:
        """End a live job: release its blocks now and free it on the worker next Step."""
        assert status.finished
        if job.status.finished:
            return
        job.status = status
        job.finish_time = now
        job.error = error
        self._remove(job)
        job.kv.on_worker = False
        reason = job.finish_reason or "error"
        self.num_finished[reason] = self.num_finished.get(reason, 0) + 1
        if job.first_predicted_output_tokens is not None and status in (
                JobStatus.FINISHED_STOPPED, JobStatus.FINISHED_LENGTH):
            self.num_predicted += 1
            self._prediction_abs_error += abs(job.first_predicted_output_tokens
                                              - len(job.output))

    def cancel(self, job_id: int, now: float) -> Job | None:
        job = self.jobs.get(job_id)
        if job is not None:
            self.finish(job, JobStatus.CANCELLED, now)
        return job

    def evacuate(self) -> list[Job]:
        """The worker is gone, its jobs are not: every live job leaves this group with its
        prompt and output (another group recomputes its KV); nothing is left to free on the
        worker, and no Step in flight will answer."""
        jobs = list(self.jobs.values())
        self._in_flight.clear()
        self._busy.clear()
        for job in jobs:
            job.kv.on_worker = False
            self.detach(job)
        self._pending_frees.clear()
        self.kv.forget_outgoing()
        return jobs

    def fail_all(self, error: str, now: float) -> list[Job]:
        """The worker is gone: every live job fails; nothing is left to free on it."""
        failed = list(self.jobs.values())
        for job in failed:
            job.kv.on_worker = False
            job.worker_lost = True
            self.finish(job, JobStatus.FAILED, now, error)
        self._pending_frees.clear()
        self.kv.forget_outgoing()  # Steps that never answered
        self._in_flight.clear()
        self._busy.clear()
        return failed

    def detach(self, job: Job) -> None:
        """Take a live job out of this group, KV and all, so another group can run it (its
        prompt and output stay; its placement starts over)."""
        assert job.job_id not in self._busy, "a job in a plan in flight cannot leave"
        self._remove(job)
        job.kv = Placement()

    def _remove(self, job: Job) -> None:
        """Take ``job`` out of the table, its blocks and store blocks returned at once and
        the worker told to free it in the next Step."""
        self._num_waiting -= not job.started
        self._num_waiting_single -= not job.started and len(job.prompt) == 1
        self._waiting_prompt_tokens -= 0 if job.started else len(job.prompt)
        self.kv.release(job)
        self.kv.unstore(job)  # the worker frees its store handles with the job
        if job.kv.on_worker:
            self._pending_frees.append(job.job_id)
        self.policy.remove(job)
        del self.jobs[job.job_id]

    # ---- one iteration -------------------------------------------------------------------
    def load(self) -> tuple[int, int]:
        """(live jobs, -free KV blocks): the smaller, the better a place for a new job (the
        cluster layer's placement rule, and the simulator's across replicas)."""
        return (len(self.jobs), -self.kv.num_free)

    def has_work(self) -> bool:
        return bool(self.jobs) or bool(self._pending_frees)

    @property
    def policy_moved_since_plan(self) -> bool:
        """Whether the policy demoted or promoted a job since the last plan was formed."""
        return self.policy.num_demotions + self.policy.num_promotions != self._moves_at_plan

    @property
    def has_pending_frees(self) -> bool:
        return bool(self._pending_frees)

    @property
    def num_in_flight(self) -> int:
        return len(self._in_flight)

    def schedule(self, now: float) -> StepPlan | None:
        """The next iteration's plan, or None when there is nothing to send (or already
        ``pipeline_depth`` plans in flight)."""
        if len(self._in_flight) >= self.pipeline_depth:
            return None
        plan = StepPlan(free_job_ids=self._pending_frees)
        self._pending_frees = []
        self.kv.begin_step(now)
        step = StepContext(now, plan, self.policy, self._last_iteration_s,
                           max(1, min(self.config.max_batch_size, len(self._last_batch))),
                           busy=self._busy, max_batch=self._plan_batch(),
                           iterations=self.num_iterations)
        self.batcher.form(step, len(self.jobs), self._num_waiting, self._num_waiting_single)
        self._num_waiting -= len(step.started)
        self._num_waiting_single -= sum(len(j.prompt) == 1 for j in step.started)
        self._waiting_prompt_tokens -= sum(len(j.prompt) for j in step.started)
        chosen = step.chosen
        # Preempted: a job of the last plans (one per pipeline stage) that is live, left out
        # of this one, and not in another plan still in flight.
        busy, jobs = self._busy, self.jobs
        self.num_preemptions += len({j for batch in self._recent_batches for j in batch
                                     if j not in chosen and j in jobs and j not in busy})
        self._recent_batches.append(chosen)
        self._last_batch = chosen
        self.kv.end_step()
        if self._to_probe:
            self._probe(plan, step.chosen)
        self.repeatable_plan = (plan if self.pipeline_depth == 1 and not self.kv.has_claims()
                                and repeatable(plan, step) else None)
        self.passes_hold = step.passes_hold
        self.added_since_plan = 0
        self.added_least_need = NEVER
        self._moves_at_plan = self.policy.num_demotions + self.policy.num_promotions
        if not (plan.commands or plan.free_job_ids or plan.swap_out or plan.swap_in
                or plan.probes):
            return None
        jobs = self.jobs
        for c in plan.commands:  # what is planned counts as computed from now on
            jobs[c.job_id].kv.num_computed = c.num_computed
        self._next_step_id += 1
        plan.step_id = self._next_step_id
        self._in_flight[plan.step_id] = plan
        if self.pipeline_depth > 1:
            self._busy.update(plan.job_ids())
        return plan

    def _probe(self, plan: StepPlan, chosen: set[int]) -> None:
        """Ask the worker for an estimate at arrival of the jobs that wait: those left out of
        this plan, oldest first, up to ``max_batched_tokens`` probe tokens (at least one
        probe), while they are in for a wait: the oldest of them finds too few blocks free
        for its prompt, or the prompts waiting to start fill more than two Steps' prefill
        tokens. Otherwise a job left out starts within a Step or two, and its first token
        brings the same estimate without the probe's compute (most of a short prompt's
        prefill again: 0.8-1.0x of it on this CPU)."""
        k, budget = self.config.arrival_probe_tokens, self.config.max_batched_tokens
        queue, jobs, kv = self._to_probe, self.jobs, self.kv
        backlog = self._waiting_prompt_tokens > 2 * budget
        while queue:
            job = queue[0]
            if (jobs.get(job.job_id) is not job or job.started or job.job_id in chosen
                    or job.predicted_output_tokens is not None):
                queue.popleft()
                continue
            if (not plan.probes and not backlog and blocks_for(len(job.prompt) + 1, kv.block_size)
                    + self.batcher.start_reserve <= kv.num_free):
                return  # room for it: it starts soon, estimated by its first token
            n = min(k, len(job.prompt))
            if plan.probes and n > budget:
                break
            queue.popleft()
            budget -= n
            plan.probes.append(ArrivalProbe(job.job_id, job.prompt[-n:], len(job.prompt)))
            self.num_probes += 1

    def pass_floor(self) -> int:
        """The walk's floor (``WalkSkip``, ``Batcher._floor`` with no displacement) as the
        next Step's walk would start, before its batch takes blocks (nothing promised or
        claimed yet, the start reserve as ``Batcher.form`` sets it): the most it can be
        anywhere in that walk, and in the walks of a run of decodes after it (they only use
        up free blocks; ``steady.window``)."""
        kv = self.kv
        reserve = (self.batcher.reserve.blocks(self.policy.arrivals_preempt,
                                               self._plan_batch(), self.num_iterations)
                   if kv.holding else 0)
        return (kv.num_free - kv.num_reserved() - reserve) * kv.block_size

    def _plan_batch(self) -> int:
        """Jobs one plan may take. With a pipeline, the live jobs are spread over its
        ``pipeline_depth`` batches (at most ``max_batch_size`` each): one batch holding them
        all would leave the other stages idle and every job waiting a whole round of the
        pipe per token, where balanced batches keep every stage busy."""
        cap = self.config.max_batch_size
        if self.pipeline_depth == 1:
            return cap
        return max(1, min(cap, -(-len(self.jobs) // self.pipeline_depth)))

    def update(self, step_id: int, result: StepResult, now: float,
               finished_only: bool = False) -> list[JobUpdate]:
        """Apply the worker's answer to the plan ``step_id``: append tokens, finish jobs,
        charge service; the updates to stream (``finished_only``: the finished jobs' only, the
        simulator's). Raises ``UnknownStep`` for a step id not in flight."""
        plan = self._in_flight.pop(step_id, None)
        if plan is None:
            raise UnknownStep(f"step id {step_id} is not in flight "
                              f"(in flight: {sorted(self._in_flight) or 'none'})")
        if self._busy:
            self._busy.difference_update(plan.job_ids())
        self.num_iterations += 1
        if plan.commands and result.compute_time_s > 0:
            self._last_iteration_s = result.compute_time_s
        self.swap_wait_s += result.swap_wait_s
        refused = self.kv.settle(plan, result, now, self.jobs)
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
        jobs = self.jobs
        for r in result.results:
            job = jobs.get(r.job_id)
            if job is None:  # cancelled while the step ran
                continue
            job.kv.num_computed = r.num_computed
            if r.token_id is None:
                continue
            job.output.append(r.token_id)
            if job.first_token_time is None:
                job.first_token_time = now
            if r.predicted_remaining is not None:
                self._predicted(job, r.predicted_remaining)
            status = self.finish_status(job)
            if status is not None:
                self.finish(job, status, now)
            if status is not None or not finished_only:
                updates.append(JobUpdate(job, [r.token_id], [r.logprob or 0.0],
                                         status is not None))
        # A finished job has left the table (finish() removes it).
        ran = [job for c in plan.commands if (job := jobs.get(c.job_id)) is not None]
        self.policy.on_iteration(ran, result.compute_time_s, now)
        for job_id, predicted in result.estimates:
            job = jobs.get(job_id)
            # A job that started since has (or will have) its first token's estimate. It has
            # no output yet: the whole answer is still to come.
            if job is not None and not job.started and job.predicted_output_tokens is None:
                self._predicted(job, predicted)
                self.policy.on_estimate(job, now)
        return updates

    @staticmethod
    def _predicted(job: Job, remaining: float) -> None:
        """The worker's estimate of the tokens still to come, as a total within the cap. A
        job still running makes at least one more token (its end-of-sequence one)."""
        total = min(len(job.output) + max(remaining, 1.0), float(job.output_cap))
        job.predicted_output_tokens = total
        if job.first_predicted_output_tokens is None:
            job.first_predicted_output_tokens = total

    def advanced(self, num_iterations: int, iteration_s: float, finished: bool = True) -> None:
        """``steady.advance()`` applied ``num_iterations`` iterations of the last plan; the
        plan may repeat again unless a job of it ``finished``."""
        self.num_iterations += num_iterations
        self.kv.compute_s += num_iterations * iteration_s
        if iteration_s > 0:
            self._last_iteration_s = iteration_s
        if finished:
            self.repeatable_plan = None

    def reorder(self, batch: list[Job]) -> None:
        """The policy moved jobs since the last plan, and its walk would read ``batch`` (the
        plan's jobs, all of them) first in this order: the plan repeats in it
        (``steady.window``), as the next Step's walk would have formed it."""
        plan = self.repeatable_plan
        assert plan is not None
        place: dict[int, int] = {j.job_id: i for i, j in enumerate(batch)}
        plan.commands.sort(key=lambda c: place[c.job_id])
        self._moves_at_plan = self.policy.num_demotions + self.policy.num_promotions

    def finish_status(self, job: Job) -> JobStatus | None:
        """How ``job`` ends after its last token, or None while it goes on."""
        if (not job.ignore_eos and job.output[-1] in job.eos_token_ids
                and len(job.output) >= job.sampling.min_tokens):
            return JobStatus.FINISHED_STOPPED
        if len(job.output) >= job.max_tokens or job.num_tokens >= self.max_context:
            return JobStatus.FINISHED_LENGTH
        return None

    def stats(self) -> Stats:
        kv = self.kv
        return Stats(
            policy=self.policy.name,
            queues=self.policy.queues(),
            num_running=self.num_running,
            num_waiting=self.num_waiting,
            num_blocks=kv.allocator.num_blocks,
            num_used_blocks=kv.allocator.num_used,
            num_iterations=self.num_iterations,
            num_preemptions=self.num_preemptions,
            num_recomputes=kv.num_recomputes,
            num_demotions=self.policy.num_demotions,
            num_promotions=self.policy.num_promotions,
            num_finished=dict(self.num_finished),
            kv_policy=self.kv_policy.name,
            store_blocks=kv.store_blocks,
            store_used_blocks=kv.store_used,
            num_offloaded=len(kv.offloaded),
            num_swap_outs=kv.num_swap_outs,
            num_swap_ins=kv.num_swap_ins,
            num_kv_lost=kv.num_kv_lost,
            swap_wait_s=self.swap_wait_s,
            num_in_flight=len(self._in_flight),
            num_predicted=self.num_predicted,
            prediction_mae_tokens=(self._prediction_abs_error / self.num_predicted
                                   if self.num_predicted else 0.0),
            num_probes=self.num_probes,
        )

    def check_invariants(self) -> None:
        """Free + held == total, no block held twice, no job in two plans in flight."""
        assert self._num_waiting == sum(1 for j in self.jobs.values() if not j.started)
        assert self._num_waiting_single == sum(
            1 for j in self.jobs.values() if not j.started and len(j.prompt) == 1)
        assert self._waiting_prompt_tokens == sum(
            len(j.prompt) for j in self.jobs.values() if not j.started)
        self.kv.check(self.jobs.values())
        seen: set[int] = set()
        for plan in self._in_flight.values():
            ids = [c.job_id for c in plan.commands]
            assert not seen.intersection(ids), "a job is in two plans in flight"
            seen.update(ids)
