"""The worker's execution engine: per-job state and one iteration at a time.

The scheduler owns every decision; the engine keeps what it needs to execute them cheaply
(token ids, block table, sampling parameters per job) and validates each command so that one
bad command fails only its own job.

Per-step command semantics, applied in this order:

| part            | effect                                                              |
|-----------------|---------------------------------------------------------------------|
| ``free_job_ids`` | forget the jobs and release their blocks (device and store)       |
| ``swap_out``     | copy a job's KV to the store (asynchronously), release its blocks |
| ``swap_in``      | claim an offloaded job's new blocks, copy its KV back (asynchronously) |
| ``new_jobs``     | register a job (prompt, sampling, initial blocks); runs only if commanded |
| ``commands``     | append blocks, then process the next ``num_tokens`` uncomputed tokens |
| ``probes``       | after the batch: estimate jobs not admitted here (arrival.py); no state |

Copies and their ordering live in ``swap.py``; here, a command of an uploading job waits for its
swap-in, and every claim of blocks for compute waits for swap-outs still reading them.

A job samples a token in an iteration that computes its last known token; a prefill chunk
that stops short of the prompt's end samples nothing.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

import torch

from worker_svc import arrival
from worker_svc.arrival import ArrivalEstimate, ArrivalProbe
from worker_svc.errors import ErrorCode, JobRejected, KVLost
from worker_svc.kv_pool import ClaimProblem, KVPool
from worker_svc.model.llama import BatchMetadata, DecodeGroup, LlamaModel, PrefillSegment
from worker_svc.parallel.group import GroupLost, TensorGroup
from worker_svc.predictor import LengthPredictor
from worker_svc.sampler import SamplingParams, sample
from worker_svc.swap import Residency, SwapEngine, SwapStats

log = logging.getLogger(__name__)

_CLAIM_CODES = {
    ClaimProblem.INVALID: ErrorCode.INVALID_ARGUMENT,
    ClaimProblem.IN_USE: ErrorCode.FAILED_PRECONDITION,
    ClaimProblem.EXHAUSTED: ErrorCode.RESOURCE_EXHAUSTED,
}


@dataclass
class NewJob:
    job_id: int
    prompt_token_ids: list[int]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    block_ids: list[int] = field(default_factory=list)
    # Already generated (its KV was lost); recomputed like the prompt, counted as output.
    output_token_ids: list[int] = field(default_factory=list)


@dataclass
class JobCommand:
    job_id: int
    num_tokens: int = 0
    append_block_ids: list[int] = field(default_factory=list)


@dataclass
class SwapIn:
    job_id: int
    block_ids: list[int] = field(default_factory=list)


@dataclass
class StepCommand:
    new_jobs: list[NewJob] = field(default_factory=list)
    commands: list[JobCommand] = field(default_factory=list)
    free_job_ids: list[int] = field(default_factory=list)
    swap_out: list[int] = field(default_factory=list)
    swap_in: list[SwapIn] = field(default_factory=list)
    probes: list[ArrivalProbe] = field(default_factory=list)
    # The decoder layer the probes are read at, set by the engine that answers them (a
    # group's rank 0, before its followers get the command: they hold no predictor); None:
    # the probes are not run. Never on the wire.
    probe_layer: int | None = None


@dataclass
class JobResult:
    job_id: int
    num_computed_tokens: int
    token_id: int | None = None
    logprob: float | None = None
    # The probe's predicted output tokens still to come after this one (see Probe).
    predicted_remaining: float | None = None


class Probe(Protocol):
    """Reads hidden states at sampled rows: the output-length predictor, or a recorder of
    training data. ``layers`` are the decoder layers it reads; ``wants(g)`` says whether a job
    that has just sampled its g-th output token is observed; ``observe`` returns one predicted
    remaining length per observed row (or None per row for a recorder); ``outputs`` are the
    rows' output tokens known so far."""

    layers: tuple[int, ...]

    def wants(self, num_generated: int) -> bool: ...

    def observe(self, hidden: dict[int, torch.Tensor], job_ids: Sequence[int],
                prompt_lens: Sequence[int], generated: Sequence[int],
                outputs: Sequence[Sequence[int]] | None = None
                ) -> Sequence[float | None]: ...


@dataclass
class JobError:
    job_id: int
    code: ErrorCode
    message: str


@dataclass
class StepOutcome:
    results: list[JobResult] = field(default_factory=list)
    errors: list[JobError] = field(default_factory=list)
    compute_time_s: float = 0.0
    swap_wait_s: float = 0.0
    swap: SwapStats = field(default_factory=SwapStats)
    # One per answered probe, in the command's order.
    estimates: list[ArrivalEstimate] = field(default_factory=list)


@dataclass
class _Job:
    job_id: int
    token_ids: list[int]
    sampling: SamplingParams
    block_ids: list[int]
    num_prompt_tokens: int
    num_computed: int = 0

    @property
    def num_generated(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens


@dataclass
class Prepared:
    """A batch ready for its forward pass."""

    batch: list[tuple[_Job, int]]
    input_ids: torch.Tensor
    meta: BatchMetadata
    sample_jobs: list[_Job]  # the jobs whose last known token this pass computes
    probed: list[int]  # of their rows, those the probe observes


class Engine:
    """Executes StepCommands on one model and one KV pool."""

    def __init__(self, model: LlamaModel, pool: KVPool, max_context: int | None = None,
                 swap: SwapEngine | None = None, probe: Probe | None = None,
                 group: TensorGroup | None = None):
        self.model = model
        # A tensor-parallel group: rank 0 forwards each Step to the other ranks, samples for
        # all of them, and every rank checks after the Step that they agree (parallel/group.py).
        self.group = group
        self.probe = probe
        self.pool = pool
        self.device = pool.device
        limit = model.cos.shape[0]
        self.max_context = min(max_context or limit, limit)
        self.jobs: dict[int, _Job] = {}
        # Without a store address every swap fails UNAVAILABLE ("no kvstore configured").
        self.swap = swap or SwapEngine(pool)
        # Rank 0 of a group with pipeline stages: runs each Step through them
        # (parallel/pipeline.py).
        self.pipeline: Any = None

    @property
    def vocab_size(self) -> int:
        return self.model.spec.vocab_size

    @property
    def arrival_probes(self) -> bool:
        """Whether this engine answers ``StepCommand.probes``: its probe is the output-length
        predictor (not a recorder), it leads (no group, or rank 0 of one) and holds every
        layer up to the predictor's (no pipeline stages)."""
        return (isinstance(self.probe, LengthPredictor) and self.pipeline is None
                and self.model.first_stage and self.model.last_stage
                and (self.group is None or self.group.rank == 0))

    def step(self, cmd: StepCommand) -> StepOutcome:
        """Execute one Step. With a group, raises GroupLost when the ranks fall apart."""
        if self.group is None or self.group.rank == 0:
            cmd = self._plan_probes(cmd)
        if self.pipeline is not None:  # rank 0 of pipeline stages: down the pipe and back
            return self.pipeline.submit(cmd).result()
        if self.group is not None and self.group.rank == 0:
            self.group.send_command(cmd)
        out = self._step(cmd)
        if self.group is not None:
            self.group.agree(self.fingerprint(out))
        return out

    def _plan_probes(self, cmd: StepCommand) -> StepCommand:
        """The command with the probes this engine answers, invalid ones left out (logged),
        and their layer; without probes to answer, the command with none."""
        if not cmd.probes:
            return cmd
        if not self.arrival_probes:
            log.debug("%d arrival probes ignored: this worker does not answer them",
                      len(cmd.probes))
            return replace(cmd, probes=[], probe_layer=None)
        assert isinstance(self.probe, LengthPredictor)
        valid = []
        for p in cmd.probes:
            why = arrival.problem(p, self.vocab_size, self.max_context)
            if why is None:
                valid.append(p)
            else:
                log.warning("arrival probe of job %d skipped: %s", p.job_id, why)
        return replace(cmd, probes=valid, probe_layer=self.probe.layer if valid else None)

    def _step(self, cmd: StepCommand) -> StepOutcome:
        out = StepOutcome()
        batch = self.begin(cmd, out)
        start = time.perf_counter()
        if batch:
            try:
                out.results = self._run(batch, out.errors)
            except GroupLost:
                raise
            except Exception as e:  # noqa: BLE001 - one failed forward must not kill the worker
                for job, _ in batch:
                    out.errors.append(JobError(job.job_id, ErrorCode.INTERNAL,
                                               f"forward failed: {type(e).__name__}: {e}"))
        probing = cmd.probe_layer is not None and bool(cmd.probes)
        if probing:
            assert cmd.probe_layer is not None
            # Only the engine that answers reads the predictor; a follower runs the forwards.
            predictor = self.probe if self.arrival_probes else None
            assert predictor is None or isinstance(predictor, LengthPredictor)
            out.estimates = arrival.estimate(self.model, cmd.probes, cmd.probe_layer,
                                             predictor, self.device)
        if batch or probing:
            out.compute_time_s = time.perf_counter() - start
        self.end(out)
        return out

    def begin(self, cmd: StepCommand, out: StepOutcome) -> list[tuple[_Job, int]]:
        """A Step's frees, swaps, admissions and commands, in that order (a refused part goes
        to ``out.errors``); returns what to compute: (job, tokens) pairs. ``end`` closes it."""
        self.swap.begin_step()
        for job_id in cmd.free_job_ids:
            job = self.jobs.get(job_id)
            if job is None:
                out.errors.append(JobError(job_id, ErrorCode.NOT_FOUND,
                                           f"free: unknown job {job_id}"))
            else:
                self._drop(job)
        for job_id in cmd.swap_out:
            try:
                self._swap_out(job_id)
            except JobRejected as e:
                log.info("swap_out of job %d refused: %s", job_id, e)
                out.errors.append(JobError(job_id, e.code, str(e)))
        for s in cmd.swap_in:
            try:
                self._swap_in(s)
            except JobRejected as e:
                log.info("swap_in of job %d refused: %s", s.job_id, e)
                out.errors.append(JobError(s.job_id, e.code, str(e)))
        for new in cmd.new_jobs:
            try:
                self._admit(new)
            except JobRejected as e:
                out.errors.append(JobError(new.job_id, e.code, str(e)))
        batch: list[tuple[_Job, int]] = []
        seen: set[int] = set()
        for c in cmd.commands:
            try:
                if c.job_id in seen:
                    raise JobRejected(ErrorCode.INVALID_ARGUMENT,
                                      f"job {c.job_id} is commanded twice in one step")
                seen.add(c.job_id)
                job = self._apply(c)
            except JobRejected as e:
                out.errors.append(JobError(c.job_id, e.code, str(e)))
                continue
            if c.num_tokens > 0:
                batch.append((job, c.num_tokens))
        return batch

    def end(self, out: StepOutcome) -> None:
        """Close the Step ``begin`` opened: its swap waits and counts go to ``out``."""
        out.swap_wait_s, out.swap = self.swap.end_step()

    def fingerprint(self, out: StepOutcome) -> str:
        """This rank's state after a Step, which every rank of a group must share."""
        errors = sorted((e.job_id, e.code.value) for e in out.errors)
        return f"{self.pool.num_used_blocks}|{len(self.jobs)}|{errors}"

    def settle(self, tokens: dict[int, int]) -> None:
        """Append tokens sampled elsewhere (a pipeline's last stage) to their jobs; a job
        freed meanwhile is skipped."""
        for job_id, token in tokens.items():
            job = self.jobs.get(job_id)
            if job is not None:
                job.token_ids.append(token)

    def _drop(self, job: _Job) -> None:
        """Forget a job: wait for its copies in flight, free its store space and its blocks."""
        del self.jobs[job.job_id]
        self.swap.forget(job.job_id)
        self.pool.release(job.block_ids)

    def _live(self, job_id: int, what: str) -> _Job:
        job = self.jobs.get(job_id)
        if job is None:
            raise JobRejected(ErrorCode.NOT_FOUND, f"{what}: unknown job {job_id}")
        return job

    def _finish_upload(self, job: _Job) -> None:
        """The job's swap-in is needed now: wait for it; on failure the job is dropped."""
        try:
            self.swap.finish_upload(job.job_id)
        except KVLost:
            self._drop(job)
            raise

    def _swap_out(self, job_id: int) -> None:
        job = self._live(job_id, "swap_out")
        residency = self.swap.residency(job_id)
        if residency is Residency.OFFLOADED:
            raise JobRejected(ErrorCode.FAILED_PRECONDITION,
                              f"swap_out: job {job_id} is already offloaded")
        if residency is Residency.UPLOADING:
            self._finish_upload(job)
        kv_blocks = math.ceil(job.num_computed / self.pool.block_size)
        self.swap.offload(job_id, job.block_ids[:kv_blocks])
        self.pool.release(job.block_ids)
        job.block_ids = []

    def _swap_in(self, s: SwapIn) -> None:
        job = self._live(s.job_id, "swap_in")
        residency = self.swap.residency(s.job_id)
        if residency is not Residency.OFFLOADED:
            where = "on the device" if residency is Residency.DEVICE else "already swapping in"
            raise JobRejected(ErrorCode.FAILED_PRECONDITION,
                              f"swap_in: job {s.job_id} is not offloaded (it is {where})")
        needed = math.ceil(job.num_computed / self.pool.block_size)
        if len(s.block_ids) != needed:
            raise JobRejected(ErrorCode.INVALID_ARGUMENT,
                              f"swap_in: job {s.job_id} has {job.num_computed} computed tokens, "
                              f"so block_ids must list exactly {needed} blocks; got "
                              f"{len(s.block_ids)}")
        self._check_blocks(s.job_id, s.block_ids)
        try:
            self.swap.upload(s.job_id, s.block_ids)
        except KVLost:
            self._drop(job)
            raise
        self.pool.claim(s.job_id, s.block_ids)
        job.block_ids = list(s.block_ids)

    def _admit(self, new: NewJob) -> None:
        if new.job_id in self.jobs:
            raise JobRejected(ErrorCode.ALREADY_EXISTS, f"job {new.job_id} already exists")
        n = len(new.prompt_token_ids)
        total = n + len(new.output_token_ids)
        if n == 0:
            raise JobRejected(ErrorCode.INVALID_ARGUMENT, "prompt_token_ids must not be empty")
        if total >= self.max_context:
            raise JobRejected(ErrorCode.INVALID_ARGUMENT,
                              f"prompt_token_ids + output_token_ids has {total} tokens; the "
                              f"limit is {self.max_context - 1} (max context {self.max_context})")
        for name, ids in (("prompt_token_ids", new.prompt_token_ids),
                          ("output_token_ids", new.output_token_ids)):
            bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
            if bad is not None:
                raise JobRejected(ErrorCode.INVALID_ARGUMENT,
                                  f"{name} contains {bad}, outside [0, {self.vocab_size})")
        why = new.sampling.validate(self.vocab_size)
        if why:
            raise JobRejected(ErrorCode.INVALID_ARGUMENT, f"sampling: {why}")
        self._check_blocks(new.job_id, new.block_ids)
        self.swap.make_writable(new.block_ids)
        self.pool.claim(new.job_id, new.block_ids)
        tokens = list(new.prompt_token_ids) + list(new.output_token_ids)
        self.jobs[new.job_id] = _Job(new.job_id, tokens, new.sampling, list(new.block_ids), n)

    def _check_blocks(self, job_id: int, block_ids: list[int]) -> None:
        problem = self.pool.check_claim(job_id, block_ids)
        if problem is not None:
            kind, why = problem
            raise JobRejected(_CLAIM_CODES[kind], f"block_ids: {why}")

    def _apply(self, c: JobCommand) -> _Job:
        job = self.jobs.get(c.job_id)
        if job is None:
            raise JobRejected(ErrorCode.NOT_FOUND, f"unknown job {c.job_id}")
        residency = self.swap.residency(c.job_id)
        if residency is Residency.OFFLOADED:
            raise JobRejected(ErrorCode.FAILED_PRECONDITION,
                              f"job {c.job_id} is offloaded; swap it in before commanding it")
        if residency is Residency.UPLOADING:
            self._finish_upload(job)
        pending = len(job.token_ids) - job.num_computed
        if not 0 <= c.num_tokens <= pending:
            raise JobRejected(ErrorCode.INVALID_ARGUMENT,
                              f"num_tokens must be in [0, {pending}] for job {c.job_id}, "
                              f"got {c.num_tokens}")
        end = job.num_computed + c.num_tokens
        if end > self.max_context:
            raise JobRejected(ErrorCode.OUT_OF_RANGE,
                              f"job {c.job_id} would reach {end} tokens; max context is "
                              f"{self.max_context}")
        needed = math.ceil(end / self.pool.block_size)
        have = len(job.block_ids) + len(c.append_block_ids)
        if needed > have:
            raise JobRejected(ErrorCode.INVALID_ARGUMENT,
                              f"job {c.job_id} needs {needed} blocks for {end} tokens, "
                              f"holds {have}")
        if c.append_block_ids:
            self._check_blocks(c.job_id, c.append_block_ids)
            self.swap.make_writable(c.append_block_ids)
            self.pool.claim(c.job_id, c.append_block_ids)
            job.block_ids.extend(c.append_block_ids)
        return job

    def _run(self, batch: list[tuple[_Job, int]],
             errors: list[JobError]) -> list[JobResult]:
        """Compute ``batch``; a job that cannot be sampled goes to ``errors`` instead."""
        b = self.prepare(batch)
        logits = self.model.forward(b.input_ids, b.meta, self.pool)
        self.advance(b)
        tokens, logprobs, failed = self._sample(logits, b.sample_jobs)
        sampled = self.append_sampled(b, tokens, logprobs, failed)
        predicted = self.observe(b) if b.probed else {}
        return self.results(b, sampled, failed, predicted, errors)

    def prepare(self, batch: list[tuple[_Job, int]]) -> Prepared:
        """The packed inputs and metadata of ``batch``'s forward pass."""
        bs = self.pool.block_size
        window = self.model.spec.sliding_window
        dev = self.device
        ids: list[int] = []
        positions: list[int] = []
        slots: list[int] = []
        prefills: list[PrefillSegment] = []
        decode_rows: list[int] = []
        decode_jobs: list[_Job] = []
        sample_rows: list[int] = []
        sample_jobs: list[_Job] = []
        for job, n in batch:
            start, c = len(ids), job.num_computed
            ids.extend(job.token_ids[c:c + n])
            for pos in range(c, c + n):
                positions.append(pos)
                slots.append(job.block_ids[pos // bs] * bs + pos % bs)
            if n == 1 and c > 0:
                decode_rows.append(start)
                decode_jobs.append(job)
            else:
                prefills.append(self._segment(job, start, n, window))
            if c + n == len(job.token_ids):
                sample_rows.append(start + n - 1)
                sample_jobs.append(job)
        meta = BatchMetadata(
            positions=torch.tensor(positions, dtype=torch.long, device=dev),
            slot_mapping=torch.tensor(slots, dtype=torch.long, device=dev),
            prefills=prefills,
            decode=self._decode_group(decode_rows, decode_jobs),
            logits_index=torch.tensor(sample_rows, dtype=torch.long, device=dev),
        )
        probe = self.probe
        # Sampled rows the probe observes: each such job is about to make its (g+1)-th token.
        probed = ([i for i, j in enumerate(sample_jobs) if probe.wants(j.num_generated + 1)]
                  if probe is not None else [])
        if probed:
            meta.probe_layers = probe.layers
        input_ids = torch.tensor(ids, dtype=torch.long, device=dev)
        return Prepared(batch, input_ids, meta, sample_jobs, probed)

    def advance(self, b: Prepared) -> None:
        """The batch's tokens are computed (their KV is in the pool)."""
        for job, n in b.batch:
            job.num_computed += n

    def append_sampled(self, b: Prepared, tokens: Sequence[int],
                       logprobs: Sequence[float | None],
                       failed: dict[int, str]) -> dict[int, tuple[int, float | None]]:
        """Append each sampled row's token to its job (a failed row gets none); returns
        job id -> (token, logprob)."""
        sampled = {}
        for i, (job, tok, lp) in enumerate(zip(b.sample_jobs, tokens, logprobs, strict=True)):
            if i not in failed:
                job.token_ids.append(tok)
                sampled[job.job_id] = (tok, lp)
        return sampled

    def results(self, b: Prepared, sampled: dict[int, tuple[int, float | None]],
                failed: dict[int, str], predicted: dict[int, float],
                errors: list[JobError]) -> list[JobResult]:
        """A result per computed job; a job whose row could not be sampled (its own numbers
        went wrong) fails alone, in ``errors``. ``failed`` is by sampled row."""
        for i, why in failed.items():
            errors.append(JobError(b.sample_jobs[i].job_id, ErrorCode.INVALID_ARGUMENT, why))
        unsampled = {b.sample_jobs[i].job_id for i in failed}
        out = []
        for job, _ in b.batch:
            if job.job_id in unsampled:
                continue
            tok, lp = sampled.get(job.job_id, (None, None))
            out.append(JobResult(job.job_id, job.num_computed, tok, lp,
                                 predicted.get(job.job_id)))
        return out

    def _sample(self, logits: torch.Tensor, jobs: list[_Job]
                ) -> tuple[list[int], list[float | None], dict[int, str]]:
        """Tokens, their logprobs and the rows that failed (row -> why); in a group, rank 0's
        tokens on every rank (the others' logits are the same, their random draws need not be)."""
        group = self.group
        if group is not None and group.rank != 0:
            shared = group.share_tokens([0] * len(jobs))
            failed = {i: "sampling failed on rank 0" for i, t in enumerate(shared) if t < 0}
            return shared, [None] * len(jobs), failed
        tokens, logprobs, failed = sample(logits, [j.sampling for j in jobs],
                                          [j.num_generated for j in jobs],
                                          [j.job_id for j in jobs])
        if group is not None:
            group.share_tokens([-1 if i in failed else t for i, t in enumerate(tokens)])
        return list(tokens), list(logprobs), failed

    def observe(self, b: Prepared, pending: int = 0) -> dict[int, float]:
        """The probe's predictions for the sampled rows it wants, by job id. ``pending``: 1
        where the rows' new tokens are not appended yet (a pipeline stage before the last)."""
        assert self.probe is not None
        rows = torch.tensor(b.probed, dtype=torch.long, device=self.device)
        hidden = {layer: h.index_select(0, rows) for layer, h in b.meta.probes.items()}
        jobs = [b.sample_jobs[i] for i in b.probed]
        try:
            values = self.probe.observe(hidden, [j.job_id for j in jobs],
                                        [j.num_prompt_tokens for j in jobs],
                                        [j.num_generated + pending for j in jobs],
                                        [j.token_ids[j.num_prompt_tokens:] for j in jobs])
        except Exception:  # a broken probe costs predictions, never tokens
            log.exception("the output-length probe failed; this step has no predictions")
            return {}
        return {j.job_id: v for j, v in zip(jobs, values) if v is not None}

    def _segment(self, job: _Job, start: int, n: int, window: int | None) -> PrefillSegment:
        c = job.num_computed
        ctx = c + n
        table = torch.tensor(job.block_ids[: math.ceil(ctx / self.pool.block_size)],
                             dtype=torch.long, device=self.device)
        mask = None
        if c > 0 or (window is not None and n > window):
            q_pos = torch.arange(c, ctx, device=self.device)[:, None]
            k_pos = torch.arange(ctx, device=self.device)[None, :]
            mask = k_pos <= q_pos
            if window is not None:
                mask &= k_pos > q_pos - window
        return PrefillSegment(start, n, ctx, table, mask)

    def _decode_group(self, rows: list[int], jobs: list[_Job]) -> DecodeGroup | None:
        if not rows:
            return None
        bs = self.pool.block_size
        ctx = [j.num_computed + 1 for j in jobs]
        max_blocks = max(math.ceil(c / bs) for c in ctx)
        tables = [j.block_ids[:max_blocks] + [0] * (max_blocks - len(j.block_ids[:max_blocks]))
                  for j in jobs]
        return DecodeGroup(
            token_index=torch.tensor(rows, dtype=torch.long, device=self.device),
            block_tables=torch.tensor(tables, dtype=torch.long, device=self.device),
            context_lens=torch.tensor(ctx, dtype=torch.long, device=self.device),
        )
