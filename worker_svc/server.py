"""The worker's gRPC service: a thin layer over the engine (fastserve.v1.Worker).

One Step stream at a time drives the engine. Every use of the engine (Steps, profiling, the
frees of a detached scheduler) runs on one compute thread (``compute_thread.py``), never on
the gRPC thread that received the call. Everything
a stream creates dies with it: when the stream ends (the scheduler closed it, cancelled, or its
connection dropped) the worker frees the stream's jobs, so a reconnecting scheduler starts from
an empty pool.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator
from concurrent import futures
from concurrent.futures import Future
from typing import NoReturn

import grpc
from grpc_health.v1 import health

import fastserve
from fastserve.proto import worker_pb2 as pb
from fastserve.proto import worker_pb2_grpc
from fastserve.serving import start_with_health
from fastserve.tls import Tls
from worker_svc import profiler, wire
from worker_svc.compute_thread import ComputeThread, ComputeThreadClosed
from worker_svc.engine import ErrorCode, JobError, StepCommand, StepOutcome
from worker_svc.kv_pool import KVPoolConfig
from worker_svc.loader import LoadedModel
from worker_svc.parallel.group import HEARTBEAT_S, GroupLost
from worker_svc.parallel.layout import exit_group_lost

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["Worker"].full_name
# A scheduler that reconnects right after its previous stream broke may arrive before the
# worker has noticed; waiting this long for the old stream to finish avoids a spurious refusal.
ATTACH_WAIT_S = 2.0
# A group's rank 0 runs an empty Step on every rank when it has had none for HEARTBEAT_S
# (group.py), so an idle group notices a rank that died (and exits, to be restarted) before a
# request does, and its followers always hear from it.


class WorkerServicer(worker_pb2_grpc.WorkerServicer):
    """Serves Describe, Profile and Step for one loaded model."""

    def __init__(
        self,
        loaded: LoadedModel,
        model_arg: str | None = None,
        on_step: Callable[[StepOutcome, int], None] | None = None,
        compute: ComputeThread | None = None,
    ):
        self.loaded = loaded
        # The thread that loaded the model, when the caller passes it (see compute_thread.py).
        self.compute = compute or ComputeThread()
        self.engine = loaded.engine
        self.model_arg = model_arg if model_arg is not None else loaded.model_path
        self.on_step = on_step  # called with each Step's outcome and commanded tokens (metrics)
        # Held by the Step stream that drives the engine.
        self._attached = threading.Lock()
        self._last_step = time.monotonic()
        if self.engine.group is not None:
            threading.Thread(target=self._heartbeat, name="group-heartbeat", daemon=True).start()

    def _heartbeat(self) -> None:
        while True:
            time.sleep(HEARTBEAT_S / 2)
            if time.monotonic() - self._last_step < HEARTBEAT_S:
                continue
            try:
                self.compute.run(self._empty_step)
            except ComputeThreadClosed:
                return

    def _empty_step(self) -> None:
        """Compute thread: nothing to do but meet every rank (a dead one loses the group)."""
        self._last_step = time.monotonic()
        try:
            self.engine.step(StepCommand())
        except GroupLost as e:
            group_lost(e)

    def Describe(
        self, request: pb.DescribeRequest, context: grpc.ServicerContext
    ) -> pb.DescribeResponse:
        spec, pool = self.loaded.spec, self.engine.pool
        store = self.engine.swap.info()
        layout = self.loaded.group
        # Each rank holds its heads' and layers' part of every block under its own lease: the
        # whole group's block is the whole model's.
        full = self.loaded.spec
        block_bytes = KVPoolConfig(full.num_layers, full.num_kv_heads, full.head_dim,
                                   pool.num_blocks, pool.block_size).bytes_per_block(pool.dtype)
        part_bytes = pool.config.bytes_per_block(pool.dtype)
        return pb.DescribeResponse(
            model=self.model_arg,
            model_path=str(self.loaded.model_path),
            dtype=str(pool.dtype).removeprefix("torch."),
            device=str(pool.device),
            block_size=pool.block_size,
            num_blocks=pool.num_blocks,
            kv_bytes_per_block=block_bytes,
            first_layer=0,
            end_layer=spec.num_layers,
            num_layers=spec.num_layers,
            max_context=self.engine.max_context,
            vocab_size=spec.vocab_size,
            eos_token_ids=list(spec.eos_token_ids),
            num_kv_heads=spec.num_kv_heads,
            head_dim=spec.head_dim,
            worker_version=fastserve.__version__,
            kvstore_address=store.address,
            store_connected=store.connected,
            store_capacity_blocks=store.capacity_blocks * part_bytes // block_bytes,
            store_same_node=store.same_node,
            store_block_bytes=store.block_bytes,
            predictor=self.loaded.predictor,
            tensor_parallel_size=layout.size,
            pipeline_parallel_size=layout.num_stages,
            arrival_probes=self.engine.arrival_probes and layout.num_stages == 1,
        )

    def Profile(
        self, request: pb.ProfileRequest, context: grpc.ServicerContext
    ) -> pb.ProfileResponse:
        # On the compute thread, so a caller that waited for someone else's measurement gets it.
        profile, code, why = self.compute.run(self._profile, request.force)
        if profile is None:
            context.abort(code, why)
        return wire.profile_to_proto(profile)

    def _profile(self, force: bool) -> tuple[profiler.Profile | None, grpc.StatusCode | None, str]:
        if not force:
            key = profiler.cache_key(self.engine, self.loaded.model_path)
            cached = profiler.load(profiler.profile_path(key))
            if cached is not None:
                return cached, None, ""
        if self.engine.jobs:
            return None, grpc.StatusCode.FAILED_PRECONDITION, (
                f"profiling needs an idle worker; {len(self.engine.jobs)} jobs are active "
                "(free them, or profile before attaching a scheduler)")
        try:
            return profiler.get_profile(self.engine, self.loaded.model_path, force=True), None, ""
        except GroupLost as e:
            group_lost(e)
        except Exception as e:  # reported to the caller
            log.exception("profiling failed")
            return None, grpc.StatusCode.INTERNAL, f"profiling failed: {e}"

    def Step(
        self, request_iterator: Iterator[pb.StepRequest], context: grpc.ServicerContext
    ) -> Iterator[pb.StepResponse]:
        if not self._attached.acquire(timeout=ATTACH_WAIT_S):
            log.warning("refused a second scheduler from %s", context.peer())
            context.abort(grpc.StatusCode.FAILED_PRECONDITION, "another scheduler is attached")
        peer = context.peer()
        log.info("scheduler attached: %s", peer)
        owned: set[int] = set()
        try:
            if self.engine.pipeline is None:
                for request in request_iterator:
                    yield self._step(request, owned)
            else:
                yield from self._pipelined(request_iterator, owned)
        finally:
            self._detach(peer, owned)
            self._attached.release()

    def _step(self, request: pb.StepRequest, owned: set[int]) -> pb.StepResponse:
        out, used = self.compute.run(self._execute, request, owned)
        return self._answer(request, out, used)

    def _answer(self, request: pb.StepRequest, out: StepOutcome,
                used: int) -> pb.StepResponse:
        """A Step's outcome, counted in the metrics, as its response."""
        if self.on_step is not None:
            self.on_step(out, sum(c.num_tokens for c in request.commands))
        return wire.step_outcome_to_proto(out, request.step_id, used,
                                          self.engine.pool.num_blocks - used)

    def _own(self, request: pb.StepRequest, owned: set[int]) -> None:
        """Compute thread: the jobs this scheduler's stream holds after ``request``,
        recomputed from the engine so it stays right even after a Step that failed midway."""
        owned.update(j.job_id for j in request.new_jobs)
        owned.intersection_update(self.engine.jobs)

    def _execute(self, request: pb.StepRequest, owned: set[int]) -> tuple[StepOutcome, int]:
        """Compute thread: one Step; returns its outcome and the blocks in use after it."""
        self._last_step = time.monotonic()
        try:
            cmd, errors = wire.step_command_from_proto(request)
            out = self.engine.step(cmd)
        except GroupLost as e:
            group_lost(e)
        except Exception as e:  # one failed Step must not end the stream
            log.exception("step %d failed", request.step_id)
            out = _fail_all(request, f"step failed: {type(e).__name__}: {e}")
        else:
            out.errors[:0] = errors
        if log.isEnabledFor(logging.DEBUG) and (request.swap_out or request.swap_in
                                                 or out.errors):
            log.debug("step %d: swap out %s, in %s; errors %s", request.step_id,
                      [s.job_id for s in request.swap_out], [s.job_id for s in request.swap_in],
                      [(e.job_id, e.code.name, e.message) for e in out.errors])
        self._own(request, owned)
        return out, self.engine.pool.num_used_blocks

    def _pipelined(self, requests: Iterator[pb.StepRequest],
                   owned: set[int]) -> Iterator[pb.StepResponse]:
        """Pipeline stages: each Step goes down the pipe as soon as it arrives (the scheduler
        keeps up to one per stage in flight) and is answered, in order, once its tokens are
        back from the last stage."""
        answers: queue.Queue = queue.Queue()

        def read() -> None:
            try:
                for request in requests:
                    answers.put((request, *self.compute.run(self._submit, request, owned)))
            except Exception as e:  # noqa: BLE001 - the stream ended under us
                log.info("Step stream closed: %s", type(e).__name__)
            finally:
                answers.put(None)

        threading.Thread(target=read, name="step-reader", daemon=True).start()
        while (item := answers.get()) is not None:
            request, future, errors, used = item
            try:
                out = future.result()
            except GroupLost as e:
                group_lost(e)
            out.errors[:0] = errors
            yield self._answer(request, out, used)

    def _submit(self, request: pb.StepRequest, owned: set[int]
                ) -> tuple[Future, list[JobError], int]:
        """Compute thread: one Step's first stage; its outcome comes with the future."""
        self._last_step = time.monotonic()
        errors: list[JobError] = []
        try:
            cmd, errors = wire.step_command_from_proto(request)
            future = self.engine.pipeline.submit(cmd)
        except GroupLost as e:
            group_lost(e)
        except Exception as e:  # one failed Step must not end the stream
            log.exception("step %d failed", request.step_id)
            future = Future()
            future.set_result(_fail_all(request, f"step failed: {type(e).__name__}: {e}"))
        self._own(request, owned)
        return future, errors, self.engine.pool.num_used_blocks

    def _detach(self, peer: str, owned: set[int]) -> None:
        try:
            self.compute.run(self._free_owned, peer, owned)
        except ComputeThreadClosed:  # the process is exiting: its pool goes with it
            log.info("scheduler detached: %s; worker exiting", peer)

    def _free_owned(self, peer: str, owned: set[int]) -> None:
        live = sorted(j for j in owned if j in self.engine.jobs)
        if live:
            before = self.engine.pool.num_used_blocks
            try:
                self.engine.step(StepCommand(free_job_ids=live))
            except GroupLost as e:
                group_lost(e)
            log.info("scheduler detached: %s; freed %d jobs (%d blocks)", peer, len(live),
                     before - self.engine.pool.num_used_blocks)
        else:
            log.info("scheduler detached: %s; no jobs to free", peer)


def group_lost(e: GroupLost) -> NoReturn:
    """A rank of this group is gone: this process's state is worthless, so it exits at once
    (the scheduler sees the worker go, moves its jobs; the supervisor restarts the group)."""
    log.error("worker group lost: %s; exiting", e)
    exit_group_lost()


def _fail_all(request: pb.StepRequest, message: str) -> StepOutcome:
    ids = dict.fromkeys(
        [
            *(s.job_id for s in request.swap_out),
            *(s.job_id for s in request.swap_in),
            *(j.job_id for j in request.new_jobs),
            *(c.job_id for c in request.commands),
        ]
    )
    return StepOutcome(errors=[JobError(j, ErrorCode.INTERNAL, message) for j in ids])


def create_server(
    loaded: LoadedModel,
    address: str,
    *,
    model_arg: str | None = None,
    health_servicer: health.HealthServicer | None = None,
    max_workers: int = 8,
    on_step: Callable[[StepOutcome, int], None] | None = None,
    compute: ComputeThread | None = None,
    tls: Tls | None = None,
) -> tuple[grpc.Server, int]:
    """A started gRPC server for ``loaded`` on ``address`` (port 0 picks a free port).

    Serves fastserve.v1.Worker and the standard health service, SERVING for "" and the
    Worker service. Pass ``health_servicer`` to flip it to NOT_SERVING on shutdown
    (``enter_graceful_shutdown()``). ``on_step(outcome, num_tokens)`` is called after each
    Step (metrics). ``compute`` is the thread that loaded the model (a new one if None).
    Returns the server and the bound port; raises
    RuntimeError when ``address`` cannot be bound.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="worker-rpc")
    )
    servicer = WorkerServicer(loaded, model_arg, on_step, compute)
    worker_pb2_grpc.add_WorkerServicer_to_server(servicer, server)
    return server, start_with_health(server, address, SERVICE_NAME, health_servicer, tls)
