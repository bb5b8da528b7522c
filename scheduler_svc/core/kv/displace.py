"""Room for a job that does not fit: the lower-priority jobs whose blocks it may take."""

from __future__ import annotations

from collections.abc import Iterable, Set

from scheduler_svc.core.job import Job
from scheduler_svc.core.kv.ledger import KVLedger
from scheduler_svc.core.kv.policies import KVPolicy
from scheduler_svc.core.step_context import StepContext


class Displacement:
    """Candidates are the jobs holding device blocks that rank below the job asking in this
    Step's priority walk (or that it has not reached), outside the batch, largest ENST first
    (where KV is dropped, the smallest one that covers the need first): paused jobs once the
    walk is over, or, asked during the walk with a minimum work (``displace_running_ratio``),
    started jobs below it with at least that much work left, before the walk can batch them.
    Built on first use, at most once per Step; a request larger than everything evictable marks
    that size as hopeless for the rest of the Step, so a long queue of jobs that cannot fit
    costs little.
    """

    def __init__(self, kv_policy: KVPolicy, ledger: KVLedger, step: StepContext):
        self.kv_policy = kv_policy
        self.ledger = ledger
        self.step = step
        self._victims: list[Job] | None = None
        self._enst: dict[int, float] = {}
        self._hopeless = float("inf")

    def make(self, job: Job, short: int, keep: Iterable[int], min_work: float = 0.0) -> None:
        """Evict until ``short`` more blocks are free, or evict nothing if that cannot be done.
        ``min_work``: only victims with at least this much work left (``remaining_work``);
        failing under it marks nothing hopeless, since the room may still be there.

        Victims go to the store when the policy swaps; only a dropping policy drops their KV.
        With the store full, nobody is displaced: new prefills and reactive uploads wait (the
        batcher's last resort keeps the oldest job moving).
        """
        if short <= 0 or short >= self._hopeless:
            return
        step, ledger = self.step, self.ledger
        if self._victims is None:
            self._enst = step.enst()
            busy = step.busy
            self._victims = sorted((v for v in ledger.holding.values() if v.job_id not in busy),
                                   key=lambda j: self._enst.get(j.job_id, 0.0), reverse=True)
        swaps = self.kv_policy.swapping()
        drops = self.kv_policy.drops
        seen = step.rank
        rank = seen[job.job_id]
        self._victims = [v for v in self._victims
                         if v.kv.blocks and seen.get(v.job_id, rank + 1) > rank]
        picked, total, room = [], 0, ledger.store_free()
        chosen = step.chosen
        max_drops = self.kv_policy.max_drops
        victims = self._victims
        if drops and not swaps and not min_work:
            # Dropped KV is all computed again: take the one job with the least KV that
            # covers the need (for a growing job, one block: the cheapest of all), the largest
            # ENST among equals; the ENST order only where no one job covers it. Taken in ENST
            # order, a need of a block dropped 0.74-0.77 s of prefill: recomputation came to
            # 3-4% of the compute under a 1% budget, and the MLFQs to 0.946-0.952x FCFS's
            # tokens/s on ShareGPT at 1.5x and 3x.
            fits = [v for v in victims if len(v.kv.blocks) >= short
                    and self._usable(v, chosen, keep) and v.num_recomputes < max_drops]
            if fits:
                victims = [min(fits, key=lambda v: len(v.kv.blocks))]
        for v in victims:
            if not self._usable(v, chosen, keep):
                continue
            if min_work and (step.policy.remaining_work(v) or 0.0) < min_work:
                continue
            n = len(v.kv.blocks)
            # An offload pays when the victim's round trip is over before it runs again.
            if (swaps and ledger.swappable(v) and n <= room
                    and self._enst.get(v.job_id, 0.0) > 2 * ledger.copies.seconds(n)):
                room -= n
            elif not drops or v.num_recomputes >= max_drops:
                continue
            picked.append(v)
            total += n
            if total >= short:
                break
        if total < short:
            if not min_work:
                self._hopeless = float(short)
            return
        offloaded = 0
        plan = step.plan
        for v in picked:
            n = len(v.kv.blocks)
            if self.kv_policy.evict(v, plan, drop_ok=drops) and v.kv.stored:
                offloaded += n
        if offloaded and not job.started:
            ledger.claim(job, offloaded)
        if plan.swap_out:
            # Offloaded blocks are reusable from the next Step on (KVLedger.swap_out): the job
            # asking starts then, and nobody else evicts for blocks already on their way.
            self._hopeless = 0.0

    def _usable(self, v: Job, chosen: Set[int], keep: Iterable[int]) -> bool:
        """Whether ``v`` may give up its blocks: not in the batch or kept, and not uploaded
        without having run since (its copy may still be running: moved out again it gains
        nothing, and under reactive swapping arrivals did that to the same uploads over and
        over, 63,401 swap-outs for 1,500 requests)."""
        return (v.job_id not in chosen and v.job_id not in keep
                and self.ledger.ran_since_upload(v))
