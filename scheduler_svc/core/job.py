"""A request's life inside the scheduler, and its KV placement on the group that runs it.

``Job`` is the request (prompt, sampling, output, timing, status); ``Placement`` is where its
KV lives on one worker group (device blocks, store blocks, computed tokens, whether the
worker knows it). A job that leaves a group gets a fresh ``Placement`` and keeps the rest.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

from scheduler_svc.core.job_id import JobId


class JobStatus(enum.IntEnum):
    """Ordered: every status after RUNNING is terminal."""

    WAITING = 0  # admitted, never scheduled
    RUNNING = 1  # scheduled at least once and not finished (it may be paused)
    FINISHED_STOPPED = 2  # end-of-sequence token or stop string
    FINISHED_LENGTH = 3  # max_tokens or the context limit
    CANCELLED = 4
    FAILED = 5

    @property
    def finished(self) -> bool:
        return self >= JobStatus.FINISHED_STOPPED


FINISH_REASONS = {
    JobStatus.FINISHED_STOPPED: "stop",
    JobStatus.FINISHED_LENGTH: "length",
    JobStatus.CANCELLED: "cancelled",
    JobStatus.FAILED: "error",
}


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    # No token of ``suppress`` (the job's end-of-sequence ids) is sampled before the job has
    # made ``min_tokens``.
    min_tokens: int = 0
    suppress: tuple[int, ...] = ()


# Placement and Job write their __init__ out, as the types made per iteration do
# (core/contract.py): mypyc compiles it, not the one a dataclass generates.


@dataclass(eq=False, init=False)
class Placement:
    """The scheduler's view of one job's state on its worker group."""

    blocks: list[int]  # device KV blocks, in table order
    num_computed: int  # tokens whose KV the group holds (or will, once its plan runs)
    on_worker: bool  # the worker has been sent this job (NewJob) and not told to free it
    # Blocks of this job's KV in the node's KV store: > 0 while it is offloaded (then it holds
    # no device blocks, and the worker keeps its tokens and sampler state).
    stored: int

    def __init__(self, blocks: list[int] | None = None, num_computed: int = 0,
                 on_worker: bool = False, stored: int = 0):
        self.blocks = [] if blocks is None else blocks
        self.num_computed = num_computed
        self.on_worker = on_worker
        self.stored = stored


NO_SAMPLING = Sampling()  # the default (frozen: shared)


@dataclass(eq=False, init=False)
class Job:
    """One request; ``kv`` is its placement on the worker group that runs it."""

    job_id: JobId
    prompt: list[int]
    max_tokens: int
    arrival_time: float
    sampling: Sampling
    request_id: str
    eos_token_ids: frozenset[int]
    ignore_eos: bool
    output: list[int]
    status: JobStatus
    kv: Placement
    # Timing (scheduler clock).
    first_scheduled_time: float | None
    first_token_time: float | None
    last_scheduled_time: float | None
    finish_time: float | None
    error: str
    # Failed because its worker was lost (not because of the request): clients see UNAVAILABLE.
    worker_lost: bool
    num_recomputes: int
    num_offloads: int
    # Predicted total output tokens (the worker's predictor, refined as the job decodes, or
    # the simulator's noisy truth); None when nothing predicts this job. Read by the
    # ``predictive`` policy. The first estimate is kept to measure the predictor's error.
    predicted_output_tokens: float | None
    first_predicted_output_tokens: float | None
    # The client's stated answer length (a benchmark's oracle); read by ``srpt-oracle`` only.
    output_length_hint: int | None
    # What bounds the answer for a predictor: max_tokens, unless set (the simulator ends a
    # job at its true length through max_tokens, and states the real bound here).
    length_cap: int | None
    # The job's key in its policy's order, where the policy keeps keys rather than computes
    # them (the MLFQ: its place in its queue); read by ``Ranked`` through ``KeptKey``.
    rank_key: tuple[float, ...]

    def __init__(self, job_id: int, prompt: list[int], max_tokens: int, arrival_time: float,
                 sampling: Sampling = NO_SAMPLING, request_id: str = "",
                 eos_token_ids: frozenset[int] = frozenset(), ignore_eos: bool = False,
                 output: list[int] | None = None, status: JobStatus = JobStatus.WAITING,
                 kv: Placement | None = None, first_scheduled_time: float | None = None,
                 first_token_time: float | None = None,
                 last_scheduled_time: float | None = None, finish_time: float | None = None,
                 error: str = "", worker_lost: bool = False, num_recomputes: int = 0,
                 num_offloads: int = 0, predicted_output_tokens: float | None = None,
                 first_predicted_output_tokens: float | None = None,
                 output_length_hint: int | None = None, length_cap: int | None = None):
        self.job_id = JobId(job_id)
        self.prompt = prompt
        self.max_tokens = max_tokens
        self.arrival_time = arrival_time
        self.sampling = sampling
        self.request_id = request_id
        self.eos_token_ids = eos_token_ids
        self.ignore_eos = ignore_eos
        self.output = [] if output is None else output
        self.status = status
        self.kv = Placement() if kv is None else kv
        self.first_scheduled_time = first_scheduled_time
        self.first_token_time = first_token_time
        self.last_scheduled_time = last_scheduled_time
        self.finish_time = finish_time
        self.error = error
        self.worker_lost = worker_lost
        self.num_recomputes = num_recomputes
        self.num_offloads = num_offloads
        self.predicted_output_tokens = predicted_output_tokens
        self.first_predicted_output_tokens = first_predicted_output_tokens
        self.output_length_hint = output_length_hint
        self.length_cap = length_cap
        self.rank_key = ()

    @property
    def output_cap(self) -> int:
        """The most output tokens this job could make, as far as a predictor may know."""
        return self.max_tokens if self.length_cap is None else self.length_cap

    @property
    def num_tokens(self) -> int:
        """Tokens known: prompt plus generated."""
        return len(self.prompt) + len(self.output)

    @property
    def num_pending(self) -> int:
        """Known tokens whose KV is not computed yet (the whole prompt before the first run)."""
        return len(self.prompt) + len(self.output) - self.kv.num_computed

    @property
    def started(self) -> bool:
        return self.first_scheduled_time is not None

    @property
    def finish_reason(self) -> str | None:
        return FINISH_REASONS.get(self.status)
