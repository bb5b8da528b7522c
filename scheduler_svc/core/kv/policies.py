"""What happens to paused jobs' KV when device blocks run short (FastServe section 3).

Four policies behind one interface; the batcher asks them, never their names:
- ``proactive``: after the batch is formed, offload the paused jobs with the largest
  Estimated Next Scheduled Time while free blocks are under a headroom kept for arrivals, and
  upload the offloaded jobs whose ENST is within two iterations, so their copy overlaps this
  iteration's compute;
- ``reactive``: a paused job is swapped out only when a higher-priority job needs its blocks,
  and back in when it is scheduled (the copy on the critical path);
- ``recompute``: a paused job's KV is dropped when a higher-priority job needs its blocks;
- ``defer``: paused jobs keep their KV; new jobs wait for free blocks.
Without a store up, the swapping policies keep paused KV where it is.
"""

from __future__ import annotations

from collections import deque
from typing import ClassVar

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import StepPlan
from scheduler_svc.core.job import Job
from scheduler_svc.core.kv.allocator import blocks_for
from scheduler_svc.core.kv.ledger import KVLedger
from scheduler_svc.core.step_context import StepContext

KV_POLICY_CLASSES: dict[str, type[KVPolicy]] = {}


def make_kv_policy(config: SchedulerConfig, ledger: KVLedger) -> KVPolicy:
    try:
        cls = KV_POLICY_CLASSES[config.kv_policy]
    except KeyError:
        raise ValueError(f"scheduler kv_policy must be one of {sorted(KV_POLICY_CLASSES)}, "
                         f"got {config.kv_policy!r}") from None
    return cls(config, ledger)


class KVPolicy:
    name: ClassVar[str]
    swaps: ClassVar[bool] = False  # paused jobs' KV goes to the store (when one is up)
    drops: ClassVar[bool] = False  # paused jobs' KV is dropped, to be recomputed
    # Whether a job that does not fit may take paused jobs' blocks at all.
    displaces: ClassVar[bool] = True
    # Whether exchanges are planned ahead by ENST (after the batch is formed) rather than made
    # on the critical path when an offloaded job is scheduled.
    plans_ahead: ClassVar[bool] = False
    # How many times a job's KV may be dropped to make room for a higher-priority job (the
    # batcher's last resort aside). Each drop is its whole context computed again: under
    # overload, arrivals dropped paused jobs over and over (5 recomputes per request, 0.36x
    # FCFS's throughput with skip-join MLFQ); once bounds the waste to one prefill per job.
    max_drops: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        KV_POLICY_CLASSES[cls.name] = cls

    def __init__(self, config: SchedulerConfig, ledger: KVLedger):
        self.config = config
        self.ledger = ledger

    def swapping(self) -> bool:
        """Whether paused jobs' KV moves to the store now (a swapping policy, the store up)."""
        return self.swaps and self.ledger.store_up

    def may_evict(self) -> bool:
        """Whether a job that does not fit may take a lower-priority paused job's blocks."""
        return self.drops or self.swapping()

    def evict(self, victim: Job, plan: StepPlan, drop_ok: bool) -> bool:
        """Free ``victim``'s device blocks: offload when swapping and the store has room, else
        drop its KV when this policy drops or ``drop_ok``. Whether its blocks were freed."""
        ledger = self.ledger
        if ledger.moved(victim, plan):
            return False  # one move per job per Step: the worker applies swap-outs first
        if (self.swapping() and ledger.swappable(victim)
                and len(victim.kv.blocks) <= ledger.store_free()):
            ledger.swap_out(victim, plan)
            return True
        if self.drops or drop_ok:
            ledger.drop(victim, plan)
            return True
        return False

    def begin_walk(self) -> None:
        """This Step's walk is about to start (``new_job_room`` reads what it fixes)."""

    def new_job_room(self, displaceable: int, iteration_s: float, claimed: int) -> int:
        """Blocks new jobs of this Step may displace from paused jobs, in all, where the new
        jobs walked before have claimed ``claimed`` of them."""
        if self.drops:
            return displaceable
        if self.ledger.copies.backlog() <= 2 * iteration_s:
            return min(displaceable, self.ledger.store_free())
        return 0  # the copy engine is busy: no displacement this Step

    def drop_allowance(self) -> float:
        """How much more KV new jobs may drop now: seconds of computing it again with a cost
        model, else tokens (``KVLedger.num_dropped_s`` / ``num_dropped_tokens``); below 0 the
        budget is spent."""
        return float("inf")

    def on_arrival(self, job: Job, now: float) -> None:
        """A job was admitted."""

    def after_batch(self, step: StepContext) -> None:
        """The batch is formed: exchanges planned ahead go into ``step.plan`` here."""

    def steady(self, now: float, min_free: int, batch_size: int,
               arrivals_preempt: bool, last: float) -> bool:
        """Whether ``after_batch`` plans nothing in the Steps from ``now`` to ``last`` while
        free blocks stay at least ``min_free``, nothing arrives and the last plan's batch
        repeats (``core/steady.py``). Only the planner plans there."""
        return True


class Reactive(KVPolicy):
    name = "reactive"
    swaps = True


class Recompute(KVPolicy):
    """Drops paused jobs' KV for higher-priority jobs, within a budget: new jobs displace only
    while computing the dropped tokens again takes at most ``kv_recompute_budget`` of the
    group's compute time so far (the cost model's prefill time; without a cost model, while
    the tokens dropped are at most that fraction of the prompt tokens prefilled). Unbounded,
    arrivals under overload dropped 0.7 paused jobs per request, whose KV came to 37% of all
    the prompts' tokens, computed a second time (the MLFQs at 0.89x FCFS's throughput on the
    Azure conversations at 1.4x capacity). A budget in prompt tokens bounded that where
    prompts are a small part of the work, but not on the code trace, whose prompts are most
    of it: 10% of them computed again cost `predictive` 10-12% of FCFS's throughput."""

    name = "recompute"
    drops = True

    def __init__(self, config: SchedulerConfig, ledger: KVLedger):
        super().__init__(config, ledger)
        self._prefilled = 0  # prompt and recomputed tokens planned in prefill chunks
        # What was left of the budget when this Step's walk started, and it in blocks (worked
        # out on the first new job to claim room: most Steps have none).
        self._allowance = 0.0
        self._room: float | None = None

    def begin_walk(self) -> None:
        self._allowance = self.drop_allowance()
        self._room = None

    def new_job_room(self, displaceable: int, iteration_s: float, claimed: int) -> int:
        # The budget is checked where room is claimed, against what this Step's new jobs
        # claimed before: checked once per Step, every new job in it could drop paused KV,
        # and recomputation took 3.4% of the compute on the code trace at 3x for a budget of
        # 1%. The claim that crosses the budget goes through (the drops a walk has claimed
        # room for are never refused: charged per drop instead, new jobs took batch slots on
        # room they then did not get, 0.62x FCFS on the real cluster at 3x); later ones wait.
        if self._room is None:
            self._room = self._in_blocks(self._allowance)
        return displaceable if claimed <= self._room else claimed

    def _in_blocks(self, allowance: float) -> float:
        """A drop allowance in blocks: the tokens whose KV takes that long to compute again
        by the cost model, else the tokens themselves; below 0 when the budget is spent."""
        ledger = self.ledger
        cm = ledger.cost_model
        if allowance <= 0 or cm is None:
            return allowance / ledger.block_size
        # Dropped KV of t tokens costs prefill_time(t) - prefill_time(1) (KVLedger.drop).
        tokens = cm.prefill_tokens_within(allowance + cm.prefill_time(1),
                                          ledger.allocator.num_blocks * ledger.block_size)
        return float("inf") if tokens < 0 else tokens / ledger.block_size

    def drop_allowance(self) -> float:
        ledger, budget = self.ledger, self.config.kv_recompute_budget
        if ledger.cost_model is not None:
            return budget * ledger.compute_s - ledger.num_dropped_s
        return budget * self._prefilled - ledger.num_dropped_tokens

    def after_batch(self, step: StepContext) -> None:
        # Every prefill chunk passes here: runs fast-forwarded at once are decodes only.
        self._prefilled += sum(c.num_tokens for c in step.plan.commands if c.num_tokens > 1)


class Defer(KVPolicy):
    name = "defer"
    displaces = False


class Proactive(KVPolicy):
    """Offload and upload by ENST, issued one iteration ahead of need."""

    name = "proactive"
    swaps = True
    plans_ahead = True

    def __init__(self, config: SchedulerConfig, ledger: KVLedger):
        super().__init__(config, ledger)
        self._arrivals: deque[tuple[float, int]] = deque()  # (time, prompt blocks)
        # No offloaded job is due for an upload in a Step before this time, while the last
        # plan's batch repeats: a job's ENST falls by at most the time gone by (a place in
        # the order stays; a starvation deadline comes nearer). -inf: not known.
        self._quiet_until = float("-inf")

    def on_arrival(self, job: Job, now: float) -> None:
        arrivals = self._arrivals
        arrivals.append((now, blocks_for(job.num_tokens + 1, self.ledger.block_size)))
        while arrivals[0][0] < now - self.config.kv_headroom_window_s:
            arrivals.popleft()

    def headroom(self, now: float, arrivals_preempt: bool) -> int:
        """Free blocks to keep for arrivals: the prompts of the last headroom window (none
        when arrivals never rank ahead of started jobs: they queue behind them anyway)."""
        if not arrivals_preempt:
            return 0
        arrivals = self._arrivals
        horizon = now - self.config.kv_headroom_window_s
        while arrivals and arrivals[0][0] < horizon:
            arrivals.popleft()
        cap = int(self.config.kv_headroom_max * self.ledger.allocator.num_blocks)
        return min(sum(b for _, b in arrivals), cap)

    def steady(self, now: float, min_free: int, batch_size: int,
               arrivals_preempt: bool, last: float) -> bool:
        ledger = self.ledger
        if not ledger.store_steady(now):
            return False
        if not ledger.store_blocks:
            return True  # no store: the planner never plans
        # The headroom only shrinks as its window moves on without arrivals.
        return ((not ledger.offloaded or last < self._quiet_until)
                and min_free >= self.headroom(now, arrivals_preempt) + batch_size)

    def after_batch(self, step: StepContext) -> None:
        self._quiet_until = float("-inf")
        if not self.ledger.store_up:
            return
        ledger, plan = self.ledger, step.plan
        # Free blocks for arrivals, plus one for each job of the batch: a decoding job needs
        # a new block every block_size tokens, and a job that cannot have one sits out its
        # iterations while paused jobs hold the device (measured under overload: 26 jobs
        # idle at a block boundary in the iterations whose batch was short).
        headroom = self.headroom(step.now, step.policy.arrivals_preempt) + len(step.chosen)
        if not ledger.offloaded and ledger.num_free >= headroom:
            return
        enst = step.enst()
        soon = 2.0 * step.iteration_s  # uploads start this far ahead (the copy overlaps)
        # Offload only jobs that will not run for a while: a job moved out and straight back
        # costs two copies and gains nothing. With a cost model that prices swaps, "a while"
        # also covers the round trip of the job's own KV.
        later = 4.0 * soon
        swap_s = ledger.copies.seconds
        # Not moved again: the batch's jobs, this plan's offloads and uploads (an upload the
        # walk deferred is not in the batch, and the worker would see its offload first),
        # and the jobs of plans still in flight.
        busy = (step.chosen | set(plan.swap_out) | {s.job_id for s in plan.swap_in}
                | step.busy)
        # Paused device jobs, largest ENST first: the ones to offload (not one uploaded that
        # has not run since: its round trip would gain nothing).
        paused = sorted((j for j in ledger.holding.values()
                         if j.job_id not in busy and ledger.swappable(j)
                         and ledger.ran_since_upload(j)),
                        key=lambda j: enst.get(j.job_id, 0.0), reverse=True)
        bs = ledger.block_size
        # Blocks of this Step's offloads: free from the next Step on (see KVLedger.swap_out).
        freeing = sum(ledger.num_outgoing(jid) for jid in plan.swap_out)

        def offload_ok(victim: Job, after: float) -> bool:
            # It runs after ``after`` and its round trip, the store can take it, and the copy
            # engine is not already busy past the next iterations (offloads queued beyond that
            # only delay the uploads behind them).
            return (enst.get(victim.job_id, 0.0) > after + 2 * swap_s(len(victim.kv.blocks))
                    and len(victim.kv.blocks) <= ledger.store_free()
                    and ledger.copies.backlog() <= soon)

        quiet = float("inf")  # the least time before an offloaded job is due, none due yet
        for job in sorted(ledger.offloaded.values(), key=lambda j: enst.get(j.job_id, 0.0)):
            if job.job_id in busy:
                continue  # offloaded in this very Step: not back before the result confirms it
            t = enst.get(job.job_id, float("inf"))
            lead = soon + swap_s(job.kv.stored)
            if t > lead:
                quiet = min(quiet, t - lead)
                continue
            quiet = float("-inf")
            need = blocks_for(job.kv.num_computed + 1, bs)
            # Make room by offloading paused jobs that will run later than this one.
            free = ledger.num_free - ledger.num_reserved()
            while free + freeing < need and paused:
                if not offload_ok(paused[0], max(t, later)):
                    break
                victim = paused.pop(0)
                freeing += len(victim.kv.blocks)
                ledger.swap_out(victim, plan)
            if free < need:
                break  # room is on its way (or cannot be made): upload from a later Step
            ledger.swap_in(job, plan)
            busy.add(job.job_id)
        self._quiet_until = step.now + quiet
        # Restore the headroom with the paused jobs that will not run soon.
        for victim in paused:
            if ledger.num_free + freeing >= headroom:
                break
            if offload_ok(victim, later):
                freeing += len(victim.kv.blocks)
                ledger.swap_out(victim, plan)
