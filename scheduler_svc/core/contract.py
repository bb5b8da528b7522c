"""What a group core hands its worker loop and gets back: plans, results, updates, stats.

Plans and results name jobs by id and carry a ``step_id``, never ``Job`` objects, so the same
types cross a wire (``scheduler_svc/wire.py``), a simulated worker (``sim/``) or a test double.
Lists of ints throughout: nothing here depends on gRPC.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler_svc.core.job import Job, Sampling
from scheduler_svc.core.job_id import JobId


@dataclass
class NewJobSpec:
    """A job the worker has not seen: its tokens so far, sampling and first block table."""

    job_id: int
    prompt: list[int]
    output: list[int]
    sampling: Sampling
    block_ids: list[int]


# The types made for every job of every iteration (Command, TokenResult, JobUpdate) and for
# every Step (StepPlan, StepResult) write their __init__ out: mypyc compiles it
# (scheduler_svc/compiled.py), while the __init__ a dataclass generates runs interpreted even
# there (15% of a long compiled simulation; then 7% under fixed-priority, in the per-Step
# types and Job's).


@dataclass(init=False)
class Command:
    """Compute ``num_tokens`` more tokens of a job, after appending ``append_block_ids``."""

    job_id: JobId
    num_tokens: int
    append_block_ids: list[int]
    # Tokens whose KV the job holds once this command ran; the job samples its next token when
    # that is every token it has (a prefill split in chunks samples after its last one).
    num_computed: int
    samples: bool

    def __init__(self, job_id: JobId, num_tokens: int, append_block_ids: list[int],
                 num_computed: int = 0, samples: bool = False):
        self.job_id = job_id
        self.num_tokens = num_tokens
        self.append_block_ids = append_block_ids
        self.num_computed = num_computed
        self.samples = samples


@dataclass
class SwapIn:
    job_id: int
    block_ids: list[int]  # the job's new block table: blocks_for(num_computed) blocks
    stored: int = 0  # store blocks the upload releases once confirmed


@dataclass
class ArrivalProbe:
    """Estimate a job's output length before its prefill, from its prompt's last tokens."""

    job_id: int
    token_ids: list[int]  # the prompt's last tokens
    prompt_tokens: int  # the whole prompt's length


@dataclass(init=False)
class StepPlan:
    """One iteration for the worker. ``commands`` is the batch, highest priority first."""

    step_id: int
    new_jobs: list[NewJobSpec]
    commands: list[Command]
    free_job_ids: list[int]
    swap_out: list[int]  # job ids
    swap_in: list[SwapIn]
    probes: list[ArrivalProbe]
    num_batched_tokens: int

    def __init__(self, step_id: int = 0, new_jobs: list[NewJobSpec] | None = None,
                 commands: list[Command] | None = None, free_job_ids: list[int] | None = None,
                 swap_out: list[int] | None = None, swap_in: list[SwapIn] | None = None,
                 probes: list[ArrivalProbe] | None = None, num_batched_tokens: int = 0):
        self.step_id = step_id
        self.new_jobs = [] if new_jobs is None else new_jobs
        self.commands = [] if commands is None else commands
        self.free_job_ids = [] if free_job_ids is None else free_job_ids
        self.swap_out = [] if swap_out is None else swap_out
        self.swap_in = [] if swap_in is None else swap_in
        self.probes = [] if probes is None else probes
        self.num_batched_tokens = num_batched_tokens

    @property
    def batch_size(self) -> int:
        return len(self.commands)

    def job_ids(self) -> list[int]:
        """Every job this plan computes or moves (a job is in one plan in flight at most)."""
        return ([c.job_id for c in self.commands] + self.swap_out
                + [s.job_id for s in self.swap_in])


@dataclass(init=False)
class TokenResult:
    job_id: JobId
    num_computed: int
    token_id: int | None
    logprob: float | None
    # The worker's predicted output tokens still to come after token_id, when it predicts.
    predicted_remaining: float | None

    def __init__(self, job_id: JobId, num_computed: int, token_id: int | None = None,
                 logprob: float | None = None, predicted_remaining: float | None = None):
        self.job_id = job_id
        self.num_computed = num_computed
        self.token_id = token_id
        self.logprob = logprob
        self.predicted_remaining = predicted_remaining


@dataclass(init=False)
class StepResult:
    results: list[TokenResult]
    errors: list[tuple[int, str]]  # (job_id, message)
    compute_time_s: float
    # Jobs whose KV the worker lost (a swap failed) and forgot: recomputed, not failed.
    kv_lost: list[int]
    # Swap-outs the worker refused (store full or unreachable): the job stays on the device.
    swap_refused: list[int]
    # Time this iteration waited for its own jobs' swaps.
    swap_wait_s: float
    # (job_id, predicted output tokens) for the plan's probes the worker answered.
    estimates: list[tuple[int, float]]

    def __init__(self, results: list[TokenResult] | None = None,
                 errors: list[tuple[int, str]] | None = None, compute_time_s: float = 0.0,
                 kv_lost: list[int] | None = None, swap_refused: list[int] | None = None,
                 swap_wait_s: float = 0.0, estimates: list[tuple[int, float]] | None = None):
        self.results = [] if results is None else results
        self.errors = [] if errors is None else errors
        self.compute_time_s = compute_time_s
        self.kv_lost = [] if kv_lost is None else kv_lost
        self.swap_refused = [] if swap_refused is None else swap_refused
        self.swap_wait_s = swap_wait_s
        self.estimates = [] if estimates is None else estimates


@dataclass(init=False)
class JobUpdate:
    """What one iteration changed for one job, for streaming to its client (the job itself
    goes with it: the stream reads its request id, output and finish reason)."""

    job: Job
    token_ids: list[int]
    logprobs: list[float]
    finished: bool

    def __init__(self, job: Job, token_ids: list[int], logprobs: list[float], finished: bool):
        self.job = job
        self.token_ids = token_ids
        self.logprobs = logprobs
        self.finished = finished


@dataclass
class Stats:
    """A snapshot of one group core, taken by its loop after each update."""

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
    num_in_flight: int = 0  # plans handed out and not answered yet
    # Finished jobs the worker's predictor estimated, and the mean absolute error of the
    # first estimate of their output length, in tokens.
    num_predicted: int = 0
    prediction_mae_tokens: float = 0.0
    num_probes: int = 0  # waiting jobs asked for an estimate at arrival
