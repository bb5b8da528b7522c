"""The iteration loop of one worker: plan -> Step -> update, over one long-lived stream.

The loop keeps the worker busy: as soon as a result arrives it is applied to the core and the
next Step is sent; only then are the new tokens handed to the request streams, whose
detokenizing and gRPC writes overlap with the worker's next iteration.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import grpc

from fastserve.proto import worker_pb2 as wpb
from fastserve.proto import worker_pb2_grpc
from fastserve.tls import Tls, channel
from scheduler_svc import wire
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import JobUpdate, Stats, StepPlan
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.group import GroupCore
from scheduler_svc.core.job import Job, JobStatus
from scheduler_svc.core.policies import POLICIES

log = logging.getLogger(__name__)

RECONNECT_S = 2.0
STORE_WAIT_S = 5.0
# An idle loop checks its worker this often: a worker that died or restarted while idle used
# to be noticed only by the first request after, which then failed.
IDLE_CHECK_S = 1.0


def layout(d: wpb.DescribeResponse) -> tuple:
    """What the core is built from: a worker that comes back with another one gets a new core
    (it once kept the old pool: "block id 53 out of range [0, 40)"). Not the store's state:
    a store that restarts beside a worker must not make the worker look lost."""
    return (d.model, d.num_blocks, d.block_size, d.max_context, d.vocab_size,
            d.pipeline_parallel_size)


@dataclass
class IterationStats:
    """One iteration as the loop saw it, for metrics and the overhead benchmark."""

    batch_size: int
    num_tokens: int
    compute_s: float  # the worker's own measurement
    round_trip_s: float  # Step written -> result read
    overhead_s: float  # previous result read -> this Step written (scheduler work)
    num_decodes: int = 0  # jobs of the batch that computed exactly one token

    @property
    def kind(self) -> str:
        """"decode" (every job one token), "prefill" (no one-token job), "mixed", or "other"
        (no job computed: frees and swaps only)."""
        if self.batch_size == 0:
            return "other"
        if self.num_decodes == self.batch_size:
            return "decode"
        return "prefill" if self.num_decodes == 0 else "mixed"


class WrongModel(ValueError):
    """The worker serves another model than the scheduler's."""


def reason(e: BaseException) -> str:
    """A worker failure in words a client can read: a gRPC error's code and details, not
    the error's whole repr (it reached clients with the debug string of the channel)."""
    if isinstance(e, grpc.aio.AioRpcError):
        return f"{e.code().name}: {e.details()}"
    if isinstance(e, TimeoutError):
        return "no answer in time"
    return f"{type(e).__name__}: {e}"


# A worker that does not answer a Step within this many times what its slowest iteration
# so far would take for the tokens in flight (at least STEP_DEADLINE_FLOOR_S, at most the
# loop's step_timeout_s) is taken for hung: its jobs move on.
STEP_DEADLINE_FACTOR = 20.0
STEP_DEADLINE_FLOOR_S = 10.0


class WorkerLoop:
    """Owns one worker connection and the GroupCore of that worker."""

    def __init__(self, address: str, config: SchedulerConfig, step_timeout_s: float = 120.0,
                 on_iteration: Callable[[IterationStats], None] | None = None,
                 pipeline_depth: int = 1, model: tuple[str, str] | None = None,
                 tls: Tls | None = None):
        self.address = address
        # (name, local path) of the model this scheduler tokenizes for: a worker serving
        # another is refused (its token ids would mean other words).
        self.model = model
        self.tls = tls  # the scheduler's certificate and the cluster CA, for the worker
        self.pipeline_depth = pipeline_depth  # Steps outstanding at most (pipeline stages)
        self.config = config
        self.step_timeout_s = step_timeout_s  # the most a Step may take, before any history
        self._slowest_per_token_s = 0.0  # the worker's slowest compute per batched token
        self.on_iteration = on_iteration
        self.core: GroupCore | None = None
        self.stats: Stats | None = None  # published by the loop after each update
        self.describe: wpb.DescribeResponse | None = None
        self.state = "connecting"
        self.error = ""
        self.sinks: dict[int, Callable[[JobUpdate], None]] = {}
        self._wake = asyncio.Event()
        self._channel: grpc.aio.Channel | None = None
        self._task: asyncio.Task | None = None
        self._pending: list[JobUpdate] = []  # applied to the core, not yet streamed
        self._core_layout: tuple | None = None  # layout() of the worker the core was built for
        # Set by the cluster layer: a lost worker's live jobs go to ``on_lost(loop, moved,
        # why)`` as (job, sink) pairs instead of failing; ``on_ready(loop)`` once it serves.
        self.on_lost: Callable[[WorkerLoop, list, str], None] | None = None
        self.on_ready: Callable[[WorkerLoop], None] | None = None

    @property
    def ready(self) -> bool:
        return self.state == "ready" and self.core is not None

    # ---- what the cluster layer reads (same event loop) -----------------------------------
    @property
    def max_context(self) -> int | None:
        return self.core.max_context if self.core is not None else None

    def can_admit(self) -> bool:
        return self.core is not None and self.core.can_admit()

    def load(self) -> tuple[int, int]:
        """(live jobs, -free KV blocks): the smaller, the better a place for a new job."""
        if self.core is None:
            return (1 << 62, 0)
        return self.core.load()

    def _publish(self) -> None:
        """A Stats snapshot for readers on other threads (metrics scrapes) and for Status."""
        if self.core is not None:
            self.stats = self.core.stats()

    async def connect(self, timeout_s: float = 60.0) -> None:
        """Describe the worker and build the core; raises if it cannot be reached in time."""
        if self._channel is not None:  # a reconnect: the old channel's stream is gone
            await self._channel.close()
        self._channel = channel(self.address, self.tls, aio=True)
        stub = worker_pb2_grpc.WorkerStub(self._channel)
        self.describe = await stub.Describe(wpb.DescribeRequest(), timeout=timeout_s,
                                            wait_for_ready=True)
        # A worker connects to its KV store in the background: give a store that is starting
        # beside it a few seconds before planning without one.
        deadline = time.monotonic() + STORE_WAIT_S
        while (self.describe.kvstore_address and not self.describe.store_connected
               and time.monotonic() < deadline):
            await asyncio.sleep(0.2)
            self.describe = await stub.Describe(wpb.DescribeRequest(), timeout=timeout_s)
        d = self.describe
        wire.check_describe(d)
        # One batch per pipeline stage in flight keeps every stage busy.
        self.pipeline_depth = self.config.steps_in_flight or max(1, d.pipeline_parallel_size)
        if self.model is not None and d.model not in self.model and d.model_path not in self.model:
            raise WrongModel(f"worker {self.address} serves model {d.model!r} "
                             f"({d.model_path}), but this scheduler serves {self.model[0]!r} "
                             f"({self.model[1]}): start both with the same --model")
        if self.config.policy == "predictive" and not d.predictor:
            log.warning("policy predictive, but worker %s has no output-length predictor: its "
                        "jobs rank by the tokens they have made (train one with `fastserve "
                        "predictor train`)", self.address)
        if self.core is not None and layout(d) != self._core_layout:
            assert not self.core.jobs, "a lost worker's jobs were failed before it came back"
            log.warning("worker %s came back with another layout (%s, was %s): its view is "
                        "rebuilt", self.address, layout(d), self._core_layout)
            self.core = None
        if self.core is None:
            cost_model = None
            if POLICIES[self.config.policy].needs_cost_model:
                # Measured once per model, device and pool, then cached by the worker.
                profile = await stub.Profile(wpb.ProfileRequest(), timeout=max(timeout_s, 600))
                if not profile.decode:
                    raise ValueError(
                        f"worker {self.address}: its pool ({d.num_blocks} blocks of "
                        f"{d.block_size} tokens) cannot hold one job to time a decode, and "
                        f"policy {self.config.policy} needs those times: give the worker more "
                        "--num-blocks, or use a policy without a cost model (fcfs)")
                cost_model = CostModel.from_profile(
                    [(p.batch_size, p.time_s) for p in profile.decode],
                    [(p.num_tokens, p.time_s) for p in profile.prefill],
                    name=f"profile:{d.model}",
                )
                log.info("cost model from %s: one decode %.1f ms", self.address,
                         cost_model.min_iteration_time * 1e3)
            capacity = min(d.max_context, d.num_blocks * d.block_size)
            # The store's capacity is shared by the workers of its node; one worker per node
            # (the local cluster, a GPU per pod) gets all of it.
            store_blocks = d.store_capacity_blocks if d.store_connected else 0
            self.core = GroupCore(self.config, d.num_blocks, d.block_size, capacity,
                                  cost_model=cost_model, store_blocks=store_blocks,
                                  pipeline_depth=self.pipeline_depth)
            self._core_layout = layout(d)
            log.info("worker %s: %d KV blocks, KV store %s (%d blocks), kv policy %s",
                     self.address, d.num_blocks, d.kvstore_address or "none", store_blocks,
                     self.config.kv_policy)
        # Estimates at arrival, from a worker that makes them, for a policy that ranks by them
        # (a worker that comes back without a predictor is asked for none).
        self.core.arrival_probes = d.arrival_probes and self.core.policy.ranks_by_prediction
        self.state = "ready"
        self.error = ""
        self._publish()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"worker-loop {self.address}")

    async def retire(self, why: str) -> None:
        """Leave the cluster (discovery says the worker is gone): stop, and hand its jobs on
        (``on_lost``) as for a lost worker."""
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
            self._task = None
        self._lost(why)
        if self._channel is not None:
            await self._channel.close()
            self._channel = None

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):  # shutting down
                await self._task
        if self._channel is not None:
            await self._channel.close()

    # ---- called by the API (same event loop, never concurrently with schedule) ------------
    def submit(self, job: Job, sink: Callable[[JobUpdate], None]) -> None:
        assert self.core is not None
        self.sinks[job.job_id] = sink
        self.core.add(job, time.monotonic())
        self._publish()
        self._wake.set()

    def end(self, job: Job, status: JobStatus) -> None:
        """Finish a job from outside (cancel, client gone, stop string); its stream is told."""
        if self.core is not None and job.job_id in self.core.jobs:
            self.core.finish(job, status, time.monotonic())
            self._publish()
            self._wake.set()
        sink = self.sinks.pop(job.job_id, None)
        if sink is not None:
            sink(JobUpdate(job, [], [], True))

    # ---- the loop -------------------------------------------------------------------------
    async def _run(self) -> None:
        while True:
            try:
                if not self.ready:
                    await self.connect()
                    log.info("worker %s ready: %s", self.address, self.describe.model)
                    if self.on_ready is not None:
                        self.on_ready(self)
                await self._serve_stream()
            except asyncio.CancelledError:
                raise
            except Exception as e:  # noqa: BLE001 - any failure means the worker is lost
                self._lost(reason(e))
                await asyncio.sleep(RECONNECT_S)

    def _lost(self, why: str) -> None:
        if self.state != "failed":
            log.error("worker %s lost: %s", self.address, why)
        self.state = "failed"
        self.error = why
        self._dispatch()  # every token the worker answered reaches its stream first
        if self.core is None:
            return
        if self.on_lost is not None:  # the jobs live on elsewhere: a pause, not an error
            moved = [(job, self.sinks.pop(job.job_id)) for job in self.core.evacuate()
                     if job.job_id in self.sinks]
            self.sinks.clear()
            self.on_lost(self, moved, why)
        else:
            for job in self.core.fail_all(f"worker {self.address} unavailable: {why}",
                                          time.monotonic()):
                sink = self.sinks.pop(job.job_id, None)
                if sink is not None:
                    sink(JobUpdate(job, [], [], True))
        self._publish()

    async def _serve_stream(self) -> None:
        assert self._channel is not None and self.core is not None
        stub = worker_pb2_grpc.WorkerStub(self._channel)
        call = stub.Step()
        core = self.core
        last_read = time.perf_counter()
        # Steps written and not answered yet: step id -> (plan, written at, overhead). The
        # core hands out at most its pipeline depth of them (1: one Step at a time).
        sent: dict[int, tuple[StepPlan, float, float]] = {}
        while True:
            while (plan := core.schedule(time.monotonic())) is not None:
                await call.write(wire.plan_to_proto(plan))
                written = time.perf_counter()
                sent[plan.step_id] = (plan, written, written - last_read)
            if not sent:
                self._dispatch()
                core.check_invariants()
                self._publish()
                self._wake.clear()
                while not self._wake.is_set():
                    try:
                        await asyncio.wait_for(self._wake.wait(), IDLE_CHECK_S)
                    except TimeoutError:
                        await self._check_idle(stub, call)
                last_read = time.perf_counter()
                continue
            # Hand the previous iteration's tokens to their streams while this one runs.
            self._dispatch()
            deadline = self._step_deadline(sum(p.num_batched_tokens for p, _, _ in sent.values()))
            try:
                msg = await asyncio.wait_for(call.read(), deadline)
            except TimeoutError:
                raise ConnectionError(
                    f"no answer to step {min(sent)} within {deadline:.0f} s (the worker's slowest "
                    f"iteration so far took {self._slowest_per_token_s * 1e3:.2f} ms a token): "
                    "taken for hung") from None
            if msg is grpc.aio.EOF:
                raise ConnectionError("worker closed the Step stream")
            last_read = time.perf_counter()
            result = wire.result_from_proto(msg)
            if msg.step_id not in sent:
                raise ConnectionError(f"worker answered step {msg.step_id}, which is not "
                                      f"in flight")
            plan, written, overhead = sent.pop(msg.step_id)
            wire.check_result(plan, result, self.describe.vocab_size)
            if plan.num_batched_tokens:
                self._slowest_per_token_s = max(self._slowest_per_token_s,
                                                result.compute_time_s / plan.num_batched_tokens)
            self._pending.extend(core.update(msg.step_id, result, time.monotonic()))
            self._publish()
            self._report(plan, result.compute_time_s, last_read - written, overhead)

    def _step_deadline(self, tokens: int) -> float:
        """How long the Steps in flight (``tokens`` batched) may take before the worker is
        taken for hung: a multiple of its own slowest pace, never under the floor, and the
        plain ``step_timeout_s`` before it has answered anything."""
        if self._slowest_per_token_s == 0.0:
            return self.step_timeout_s
        guess = STEP_DEADLINE_FACTOR * self._slowest_per_token_s * max(tokens, 1)
        return min(self.step_timeout_s, max(STEP_DEADLINE_FLOOR_S, guess))

    async def _check_idle(self, stub: worker_pb2_grpc.WorkerStub, call: object) -> None:
        """Raise if the idle worker is gone, restarted (its Step stream ended), or now
        describes another layout."""
        if call.done():  # type: ignore[attr-defined]
            raise ConnectionError("the worker's Step stream ended (it stopped or restarted)")
        d = await stub.Describe(wpb.DescribeRequest(), timeout=5 * IDLE_CHECK_S)
        if layout(d) != self._core_layout:
            raise ConnectionError(f"the worker now describes {layout(d)}, not "
                                  f"{self._core_layout}")

    def _dispatch(self) -> None:
        updates, self._pending = self._pending, []
        for u in updates:
            sink = self.sinks.get(u.job.job_id)
            if sink is not None:
                if u.finished:
                    del self.sinks[u.job.job_id]
                sink(u)

    def _report(self, plan: StepPlan, compute_s: float, round_trip_s: float,
                overhead_s: float) -> None:
        if self.on_iteration is not None:
            decodes = sum(1 for c in plan.commands if c.num_tokens == 1)
            self.on_iteration(IterationStats(plan.batch_size, plan.num_batched_tokens,
                                             compute_s, round_trip_s, overhead_s, decodes))
