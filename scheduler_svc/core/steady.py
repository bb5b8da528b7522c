"""Runs of identical decode iterations, applied at once: the simulator's way through them.

Under load most iterations decode the batch of the one before, one token per job, and nothing
in the core changes but each job's length. ``window()`` says how many of the next iterations
would plan exactly the last plan's batch again; ``advance()`` applies them as that many
``schedule()`` / ``update()`` pairs would have, with a worker that answers ``token`` for every
job. A window ends before anything that could change the plan:

| what                           | who says                        | bound                     |
|--------------------------------|---------------------------------|---------------------------|
| a job finishes                 | the job (max_tokens, context)   | its tokens left           |
| a job reaches a block boundary | the ledger                      | free blocks for each      |
| an arrival                     | the caller (``next_arrival``,   | none during a window,     |
|                                | ``arrival``)                    | unless it cannot enter (a |
|                                |                                 | full batch, arrivals that |
|                                |                                 | never outrank started     |
|                                |                                 | ones, or a prompt every   |
|                                |                                 | walk passes for blocks)   |
| a demotion, a promotion        | ``Policy.steady_iterations``    | 0 if it cannot say        |
| ... that changes the batch     | ``Policy.batch_order``          | a window after it goes on |
|                                |                                 | in the new order where the|
|                                |                                 | batch is still read first |
| an arrival's starvation        | ``Policy.starves_after_s``      | after the first arrival   |
| an exchange planned ahead      | ``KVPolicy.steady``             | free blocks vs headroom,  |
|                                |                                 | an offloaded job's ENST   |

Only plans the walk filled entirely (every job it read is in the batch: nothing skipped for
blocks, uploads or claims, which time could change), of decodes of jobs the worker holds, with
no swap, no first schedule and one plan in flight at most, can repeat. Jobs the walk passed
unread (``WalkSkip``: new jobs needing more tokens of blocks than the walk's floor) are no
obstacle where nothing could have made room for them but free blocks (``passes_hold``: no
displacement of paused KV): a run of decodes only uses free blocks up and the start reserve
only grows with the blocks held, so the floor of every later walk is at most this one's, and
every walk passes them again, and with them every arrival whose prompt needs more than the
floor (``GroupCore.pass_floor``) from the window's start. Under overload with paused KV that
cannot move (``defer``) nearly every arrival is such a job.

A window may follow another at once, from the same plan, while no job of it finished: each
starts from the state the last one left, as a plan formed then would (the simulator chains
them; ``GroupCore.advanced`` keeps the plan). Under the MLFQ most demotions only move a job
down the batch's own order, with no job the walk reads between: the plan repeats in the new
order (``GroupCore.reorder``), as the next walk would have formed it.

Exact: the simulator's figures are identical with and without (tests/scheduler_svc/
test_steady.py), and the service never calls it (a real worker's tokens are not known ahead).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from scheduler_svc.core.contract import StepPlan
from scheduler_svc.core.job import Job
from scheduler_svc.core.kv.allocator import blocks_for
from scheduler_svc.core.policies.base import Policy
from scheduler_svc.core.policies.ranked import NEVER, prompt_need
from scheduler_svc.core.step_context import StepContext

if TYPE_CHECKING:
    from scheduler_svc.core.group import GroupCore


def repeatable(plan: StepPlan, step: StepContext) -> bool:
    """Whether ``plan`` (just formed in ``step``) is of the kind that can repeat unchanged."""
    commands = plan.commands
    return (bool(commands) and not plan.new_jobs and not plan.swap_out and not plan.swap_in
            and not plan.probes and not step.started and len(step.rank) == len(commands)
            and (not step.passed or step.passes_hold)
            and all(c.num_tokens == 1 for c in commands))


def _batch(core: GroupCore) -> list[Job] | None:
    plan = core.repeatable_plan
    if plan is None:
        return None
    jobs = core.jobs
    batch = [jobs.get(c.job_id) for c in plan.commands]
    if any(job is None for job in batch):
        return None
    return batch  # type: ignore[return-value]


def _crossings(batch: list[Job], k: int, block_size: int) -> int:
    """Blocks the batch needs for ``k`` more decodes each."""
    return sum(max(blocks_for(j.kv.num_computed + k, block_size) - len(j.kv.blocks), 0)
               for j in batch)


def window(core: GroupCore, iteration_s: float, start: float, next_arrival: float,
           token: int, at_most: int | None = None,
           arrival: Callable[[int], tuple[float, int]] | None = None) -> list[float]:
    """Start times of the next iterations (the first at ``start``, each ``iteration_s`` long)
    that would each run the last plan's batch again, one decode per job, if no job arrived
    before ``next_arrival``; at most ``at_most`` of them (the caller's own bound: a worker
    answer that could change a job's rank, such as a new prediction). ``arrival(k)``, where
    the caller can tell: the arrival time and prompt tokens of the k-th job to arrive from
    ``next_arrival`` on ((inf, 0) past the last), so that the window goes on past arrivals
    that every walk would pass. Empty when none can be told."""
    batch = _batch(core)
    if batch is None or core.num_in_flight or core.has_pending_frees:
        return []
    plan = core.repeatable_plan
    assert plan is not None
    config = core.config
    full = (len(plan.commands) >= config.max_batch_size
            or plan.num_batched_tokens >= config.max_batched_tokens)
    arrivals_matter = core.policy.arrivals_preempt or not full
    # The walk's floor: new jobs needing more are passed by every walk of the window. An
    # arrival that is such a job changes no plan (nor the KV policy, unless it plans ahead
    # with a store to plan for; nor a probe), and it starves no sooner than
    # ``starves_after_s`` after it came.
    floor = core.pass_floor() if core.passes_hold else NEVER
    passes = (floor < NEVER and not core.arrival_probes
              and not (core.kv_policy.plans_ahead and core.kv.store_blocks))
    if arrivals_matter and core.added_since_plan and (
            not passes or core.added_least_need <= floor):
        return []
    if core.policy_moved_since_plan:  # e.g. the last update demoted a job
        order = core.policy.batch_order(batch, floor, full)
        if order is None:
            return []
        core.reorder(order)
        batch = order
    limit = min(1 if not job.ignore_eos and token in job.eos_token_ids
                else min(job.max_tokens - len(job.output), core.max_context - job.num_tokens)
                for job in batch)  # a job finishes in the window's last iteration at most
    if at_most is not None:
        limit = min(limit, at_most)
    reserve_holds = core.batcher.reserve.steady_limit(core.num_iterations)
    if reserve_holds is not None:  # the start reserve's memory-bound window closes
        limit = min(limit, reserve_holds)
    starts: list[float] = []
    s = start
    if arrivals_matter and passes and arrival is not None:
        starved_by = next_arrival + core.policy.starves_after_s()
        k = 0
        at, prompt = arrival(0)
        while len(starts) < limit and s <= starved_by:
            end = s + iteration_s
            while at <= end and prompt_need(prompt) > floor:  # passed: admitted, no change
                k += 1
                at, prompt = arrival(k)
            if at <= end:
                break  # it could enter; it would be admitted before this iteration's update
            starts.append(s)
            s = end
    else:
        while len(starts) < limit:
            end = s + iteration_s
            if arrivals_matter and next_arrival <= end:
                break  # it would be admitted before this iteration's update
            starts.append(s)
            s = end
    # The longest prefix whose block growth the free blocks cover and during which the KV
    # policy plans nothing (both only get worse as blocks are used: bisect).
    ledger, kvp = core.kv, core.kv_policy
    free, bs, arrivals_preempt = ledger.num_free, ledger.block_size, core.policy.arrivals_preempt

    def fits(k: int) -> bool:
        left = free - _crossings(batch, k, bs)
        return left >= 0 and kvp.steady(start, left, len(batch), arrivals_preempt,
                                         starts[k - 1])

    lo, hi = 0, len(starts)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid - 1
    if lo == 0:
        return []
    k = core.policy.steady_iterations(batch, iteration_s, starts[:lo], floor)
    return starts[:k]


def advance(core: GroupCore, starts: list[float], iteration_s: float, token: int) -> list[Job]:
    """Apply the iterations of ``window()``'s answer ``starts``: tokens, blocks, the policy's
    charges, finishes. Returns the jobs that finished (in the last iteration)."""
    batch = _batch(core)
    k = len(starts)
    assert batch is not None and k >= 1
    ledger = core.kv
    bs = ledger.block_size
    # Blocks in the order the walks would take them: by iteration, then by batch order.
    crossings: list[tuple[int, int]] = []
    for i, job in enumerate(batch):
        first = len(job.kv.blocks) * bs - job.kv.num_computed
        crossings.extend((j, i) for j in range(first, k, bs))
    crossings.sort()
    for _, i in crossings:
        ledger.grow(batch[i], 1)
    ends = [*starts[1:], starts[-1] + iteration_s]
    policy = core.policy
    charges = type(policy).on_iteration is not Policy.on_iteration
    # Every iteration but the last: no job finishes (the window ends at the first finish).
    if k > 1:
        tokens = [token] * (k - 1)
        for job in batch:
            job.kv.num_computed += k - 1
            job.output.extend(tokens)
            if job.first_token_time is None:
                job.first_token_time = ends[0]
        if charges:
            for end in ends[:-1]:
                policy.on_iteration(batch, iteration_s, end)
    end = ends[-1]
    finished, ran = [], []
    for job in batch:
        job.kv.num_computed += 1
        job.output.append(token)
        job.last_scheduled_time = starts[-1]
        if job.first_token_time is None:
            job.first_token_time = end
        status = core.finish_status(job)
        if status is not None:
            core.finish(job, status, end)
            finished.append(job)
        else:
            ran.append(job)
    policy.on_iteration(ran, iteration_s, end)
    core.advanced(k, iteration_s, bool(finished))
    return finished
