"""Where each job's KV lives on one worker group: device blocks, outgoing, store, or nowhere.

| job's KV                     | ``kv.blocks``         | ``kv.stored`` | ledger map  |
|------------------------------|-----------------------|---------------|-------------|
| nowhere (waiting, recompute) | none                  | 0             | -           |
| on the device                | ceil(computed / size) | 0             | holding     |
| offloaded, copy in flight    | none (``outgoing``)   | n             | offloaded   |
| offloaded                    | none                  | n             | offloaded   |
| uploading                    | ceil(computed / size) | 0             | holding     |

Blocks of a swap-out are reused only after the Step's result confirms it (a refused swap-out
gives them back to the job); an upload's store blocks are released when its result arrives.
The copy engine's queue is predicted from the cost model's swap prices (``CopyEngine``).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from scheduler_svc.core.contract import StepPlan, StepResult, SwapIn
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job
from scheduler_svc.core.kv.allocator import BlockAllocator, blocks_for

# After the store refuses a swap-out (full, or gone), KV stays where it is for this long.
STORE_RETRY_S = 1.0


class CopyEngine:
    """The predicted queue of the worker's copy engine (empty without a pricing model)."""

    def __init__(self, cost_model: CostModel | None, block_size: int):
        self._cost_model = cost_model
        self._block_size = block_size
        self.now = 0.0
        self._busy_until = 0.0
        self._seconds: dict[int, float] = {}  # the cost model's, by size (the planner asks
        # for every paused and offloaded job's, each Step)

    def seconds(self, num_blocks: int) -> float:
        """Predicted one-way copy time of ``num_blocks`` blocks (0 without a pricing model)."""
        if self._cost_model is None:
            return 0.0
        t = self._seconds.get(num_blocks)
        if t is None:
            t = self._seconds[num_blocks] = self._cost_model.swap_time(num_blocks,
                                                                       self._block_size)
        return t

    def queue(self, num_blocks: int) -> float:
        """Queue a copy of ``num_blocks``; returns when it is predicted to be done."""
        self._busy_until = max(self.now, self._busy_until) + self.seconds(num_blocks)
        return self._busy_until

    def backlog(self) -> float:
        """Seconds of swaps already queued on the worker's copy engine (predicted)."""
        return max(self._busy_until - self.now, 0.0)


class KVLedger:
    """Device blocks, the store's blocks for this group, and who holds which."""

    def __init__(self, num_blocks: int, block_size: int, store_blocks: int = 0,
                 cost_model: CostModel | None = None):
        self.allocator = BlockAllocator(num_blocks, block_size)
        self.block_size = block_size
        self.copies = CopyEngine(cost_model, block_size)
        self.cost_model = cost_model
        # Store accounting: capacity and blocks held there (uploads in flight included,
        # released when their Step's result confirms them).
        self.store_blocks = store_blocks
        self.store_used = 0
        self._uploading = 0  # store blocks of uploads whose Step has not answered yet
        self._holding: dict[int, Job] = {}  # live jobs holding device blocks
        self._offloaded: dict[int, Job] = {}  # live jobs whose KV is in the store
        self._outgoing: dict[int, list[int]] = {}  # swapped out, blocks not yet confirmed free
        # Uploads not computed on yet: job id -> when the copy engine is predicted to finish.
        self._ready_at: dict[int, float] = {}
        self._step_uploads: list[int] = []  # this Step's uploads, in order
        # Uploaded jobs that have not computed since: job id -> their computed tokens then.
        self._unrun: dict[int, int] = {}
        # A refused swap-out means the store is full or gone: no swaps until this time.
        self._store_retry_at = 0.0
        self.store_up = store_blocks > 0
        # Blocks a new job's offloads free for it: reserved for that job in the next Step, so
        # a job walked earlier cannot take them and leave it to displace others again.
        self._claims: dict[int, int] = {}
        self._reserved: dict[int, int] = {}  # this Step's claims
        self._reserved_total = 0
        self.num_swap_outs = 0
        self.num_swap_ins = 0
        self.num_recomputes = 0
        self.num_dropped_tokens = 0  # computed tokens whose KV was dropped, to compute again
        # With a cost model: the time those tokens take to compute again (their prefill less
        # an iteration's fixed cost), and the group's compute time so far (every iteration's).
        self.num_dropped_s = 0.0
        self.compute_s = 0.0
        self.num_kv_lost = 0

    # ---- per Step ---------------------------------------------------------------------------
    def begin_step(self, now: float) -> None:
        self.copies.now = now
        self._step_uploads = []
        self._reserved, self._claims = self._claims, {}
        self._reserved_total = sum(self._reserved.values())
        self.store_up = self.store_blocks > 0 and now >= self._store_retry_at

    def end_step(self) -> None:
        self._reserved = {}
        self._reserved_total = 0

    # ---- reading ----------------------------------------------------------------------------
    @property
    def num_free(self) -> int:
        return self.allocator.num_free

    @property
    def holding(self) -> Mapping[int, Job]:
        return self._holding

    @property
    def offloaded(self) -> Mapping[int, Job]:
        return self._offloaded

    def num_outgoing(self, job_id: int | None = None) -> int:
        """Blocks of swap-outs not confirmed yet: of ``job_id``, or of all."""
        if job_id is not None:
            return len(self._outgoing[job_id])
        return sum(len(b) for b in self._outgoing.values())

    def store_free(self) -> int:
        return self.store_blocks - self.store_used

    def free_for(self, job: Job) -> int:
        """Free blocks ``job`` may take: all but those reserved for other jobs this Step."""
        reserved = self._reserved
        if not reserved:
            return self.allocator.num_free
        return self.allocator.num_free - (self._reserved_total - reserved.get(job.job_id, 0))

    def upload_pending(self, job: Job, now: float) -> bool:
        """Whether ``job``'s upload is predicted to be still copying at ``now`` (a command for
        it would make the whole iteration wait)."""
        ready = self._ready_at.get(job.job_id)
        if ready is None:
            return False
        if ready <= now:
            del self._ready_at[job.job_id]
            return False
        return True

    def ran_since_upload(self, job: Job) -> bool:
        """Whether ``job`` computed since its last upload (or was never uploaded). A job
        uploaded and offloaded again before it runs gains nothing, and a planner whose
        estimates flip can do that for ever: seen as one job moved out and in on every Step
        of a two-stage group, never computing."""
        before = self._unrun.get(job.job_id)
        if before is None:
            return True
        if before != job.kv.num_computed:
            del self._unrun[job.job_id]
            return True
        return False

    def has_claims(self) -> bool:
        """Whether this Step reserved freed blocks for a job in the next."""
        return bool(self._claims)

    def store_steady(self, now: float) -> bool:
        """Whether ``store_up`` stays what it is from ``now`` on (no retry time ahead)."""
        return self.store_blocks == 0 or now >= self._store_retry_at

    def num_reserved(self) -> int:
        return self._reserved_total

    def claimants(self) -> set[int]:
        """The jobs with blocks reserved for them in this Step."""
        return set(self._reserved)

    def swappable(self, job: Job) -> bool:
        """A paused job whose blocks hold exactly its computed KV (the worker stores the table)."""
        kv = job.kv
        return (kv.on_worker and kv.num_computed > 0
                and len(kv.blocks) == blocks_for(kv.num_computed, self.block_size))

    @staticmethod
    def moved(job: Job, plan: StepPlan) -> bool:
        """Whether ``plan`` already offloads or uploads ``job``. A job moves at most once per
        Step: the worker applies a Step's swap-outs before its swap-ins, so an offload, upload
        and offload again of one job in one plan reached it as two offloads ("already
        offloaded"), and a job uploaded back in the Step that offloads it gains nothing."""
        return job.job_id in plan.swap_out or any(s.job_id == job.job_id for s in plan.swap_in)

    # ---- device blocks ----------------------------------------------------------------------
    def claim(self, job: Job, num_blocks: int) -> None:
        """Reserve ``num_blocks`` freed for ``job`` in the next Step."""
        self._claims[job.job_id] = self._claims.get(job.job_id, 0) + num_blocks

    def grow(self, job: Job, num_blocks: int) -> list[int]:
        """Give ``job`` ``num_blocks`` more blocks (its reservation is used up)."""
        blocks = self.allocator.allocate(num_blocks)
        self._hold(job, blocks)
        return blocks

    def _hold(self, job: Job, blocks: list[int]) -> None:
        """``job`` holds ``blocks`` too; a reservation it had in this Step is used up."""
        self._reserved_total -= self._reserved.pop(job.job_id, 0)
        if blocks and not job.kv.blocks:
            self._holding[job.job_id] = job
        job.kv.blocks.extend(blocks)

    def release(self, job: Job) -> None:
        self._ready_at.pop(job.job_id, None)
        self._unrun.pop(job.job_id, None)
        if job.kv.blocks:
            del self._holding[job.job_id]
        self.allocator.free(job.kv.blocks)
        job.kv.blocks = []

    # ---- moves ------------------------------------------------------------------------------
    def swap_out(self, job: Job, plan: StepPlan) -> None:
        """Offload ``job``. Its blocks are reused only after the Step's result confirms the
        offload: a worker whose store refuses it (full, or gone) keeps the job on the device,
        and the job then keeps its blocks here too."""
        kv = job.kv
        n = len(kv.blocks)
        self._outgoing[job.job_id] = kv.blocks
        del self._holding[job.job_id]
        self._ready_at.pop(job.job_id, None)
        self._unrun.pop(job.job_id, None)
        kv.blocks = []
        kv.stored = n
        job.num_offloads += 1
        self.store_used += n
        self._offloaded[job.job_id] = job
        self.num_swap_outs += 1
        plan.swap_out.append(job.job_id)
        self.copies.queue(n)
        # The worker copies a Step's offloads before its uploads: an offload planned after
        # an upload of the same Step delays it (counted in call order, such uploads looked
        # done while still copying, and their Steps waited for them: 47 s in a 680-s run of
        # skip-join-mlfq with reactive swapping under overload).
        if self._step_uploads:
            delay = self.copies.seconds(n)
            ready = self._ready_at
            for jid in self._step_uploads:
                if jid in ready:
                    ready[jid] += delay

    def swap_in(self, job: Job, plan: StepPlan) -> None:
        """Give an offloaded job device blocks for its KV; the store copy is released when the
        Step's result confirms the upload (until then it still occupies the store)."""
        kv = job.kv
        n = blocks_for(kv.num_computed, self.block_size)
        blocks = self.allocator.allocate(n)
        self._hold(job, blocks)
        plan.swap_in.append(SwapIn(job.job_id, list(blocks), kv.stored))
        self._uploading += kv.stored
        del self._offloaded[job.job_id]
        kv.stored = 0
        self.num_swap_ins += 1
        self._ready_at[job.job_id] = self.copies.queue(n)
        self._step_uploads.append(job.job_id)
        self._unrun[job.job_id] = kv.num_computed

    def unstore(self, job: Job) -> None:
        if job.kv.stored:
            self.store_used -= job.kv.stored
            job.kv.stored = 0
            del self._offloaded[job.job_id]

    def drop(self, job: Job, plan: StepPlan) -> None:
        """Drop ``job``'s KV: it is computed again from its prompt and output later."""
        self.num_dropped_tokens += job.kv.num_computed
        cm = self.cost_model
        if cm is not None and job.kv.num_computed:
            self.num_dropped_s += max(cm.prefill_time(job.kv.num_computed)
                                      - cm.prefill_time(1), 0.0)
        self.release(job)
        self.unstore(job)
        job.kv.num_computed = 0
        job.num_recomputes += 1
        self.num_recomputes += 1
        if job.kv.on_worker:
            plan.free_job_ids.append(job.job_id)
            job.kv.on_worker = False

    def lose(self, job: Job) -> None:
        """The worker lost this job's KV (a failed swap) and forgot the job: recompute it."""
        self.num_kv_lost += 1
        self.release(job)
        self.unstore(job)
        job.kv.num_computed = 0
        job.kv.on_worker = False
        job.num_recomputes += 1
        self.num_recomputes += 1

    # ---- results ----------------------------------------------------------------------------
    def settle(self, plan: StepPlan, result: StepResult, now: float,
               jobs: Mapping[int, Job]) -> set[int]:
        """Confirm ``plan``'s swaps from its result; returns the refused swap-outs."""
        self.compute_s += result.compute_time_s
        for s in plan.swap_in:  # uploads done (or failed: then the worker freed the handles)
            self.store_used -= s.stored
            self._uploading -= s.stored
        refused = set(result.swap_refused).intersection(plan.swap_out)
        for job_id in plan.swap_out:
            blocks = self._outgoing.pop(job_id)
            job = jobs.get(job_id)
            if job_id in refused:
                self._store_retry_at = now + STORE_RETRY_S
            if job_id in refused and job is not None and job.kv.stored:
                self.unstore(job)  # still on the device, with its KV
                self._hold(job, blocks)
            else:
                self.allocator.free(blocks)
        for job_id in result.kv_lost:
            job = jobs.get(job_id)
            if job is not None:
                self.lose(job)
        return refused

    def forget_outgoing(self) -> None:
        """The worker is gone: swap-outs that never answered give their blocks back."""
        for blocks in self._outgoing.values():
            self.allocator.free(blocks)
        self._outgoing.clear()
        self._ready_at.clear()
        self._unrun.clear()
        self.store_used -= self._uploading  # the worker freed their handles with its jobs
        self._uploading = 0

    def check(self, jobs: Iterable[Job]) -> None:
        """Free + held == total, no block held twice, the store's count right."""
        jobs = list(jobs)
        assert set(self._holding) == {j.job_id for j in jobs if j.kv.blocks}
        assert set(self._offloaded) == {j.job_id for j in jobs if j.kv.stored}
        assert all(not j.kv.blocks for j in self._offloaded.values()), "offloaded job holds blocks"
        assert set(self._ready_at) <= set(self._holding), "an upload for a job holding nothing"
        assert set(self._unrun) <= set(self._holding), "an unrun upload of a job holding nothing"
        held_in_store = sum(j.kv.stored for j in jobs) + self._uploading
        assert self.store_used == held_in_store, (
            f"store: {self.store_used} used != {held_in_store} held or uploading"
        )
        assert 0 <= self.store_used <= self.store_blocks, f"store: {self.store_used} used"
        held = [b for j in jobs for b in j.kv.blocks]
        assert len(held) == len(set(held)), "a block is held by two jobs"
        held += [b for blocks in self._outgoing.values() for b in blocks]
        assert len(held) + self.allocator.num_free == self.allocator.num_blocks, (
            f"{len(held)} held + {self.allocator.num_free} free != {self.allocator.num_blocks}"
        )
