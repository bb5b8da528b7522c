"""The client-facing gRPC service (fastserve.v1.Scheduler) over the worker loops."""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator

import grpc

from fastserve.proto import scheduler_pb2 as spb
from fastserve.proto import scheduler_pb2_grpc
from scheduler_svc.api.auth import ApiKeys
from scheduler_svc.api.requests import build_job
from scheduler_svc.api.text import IncrementalDetokenizer, InvalidRequest, TextModel
from scheduler_svc.api.text_thread import TextThread
from scheduler_svc.cluster import Cluster
from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import JobUpdate
from scheduler_svc.core.job import Job, JobStatus

log = logging.getLogger(__name__)

FINISH = {
    JobStatus.FINISHED_STOPPED: spb.FINISH_REASON_STOP,
    JobStatus.FINISHED_LENGTH: spb.FINISH_REASON_LENGTH,
    JobStatus.CANCELLED: spb.FINISH_REASON_CANCELLED,
    JobStatus.FAILED: spb.FINISH_REASON_ERROR,
}


# Core Stats fields that WorkerStatus carries under the same names.
_WORKER_STATS = (
    "num_blocks", "num_used_blocks", "num_iterations", "num_preemptions", "num_recomputes",
    "num_demotions", "num_promotions", "store_blocks", "store_used_blocks", "num_offloaded",
    "num_swap_outs", "num_swap_ins", "num_kv_lost", "swap_wait_s", "num_predicted",
    "prediction_mae_tokens", "num_running", "num_waiting", "num_probes",
)

def _next_text(detok: IncrementalDetokenizer, ids: list[int],
               finish: bool) -> tuple[str, str, bool]:
    """On the text-out thread: the text ``ids`` make safe to send (the rest too when
    ``finish``), the stop string that ended it if any, and whether ``ids`` hit one."""
    text = ""
    if ids:
        delta = detok.add(ids)
        text = delta.text
        if delta.stopped:
            return text, delta.stop_string or "", True
    if finish:
        text += detok.finish()
        return text, detok.stop_string or "", False
    return text, "", False


class SchedulerServicer(scheduler_pb2_grpc.SchedulerServicer):
    def __init__(self, config: SchedulerConfig, text: TextModel, cluster: Cluster,
                 model_name: str, on_finish=None, api_keys: ApiKeys | None = None,
                 on_refused=None):
        self.config = config
        self.text = text
        self.cluster = cluster
        self.model_name = model_name
        self.on_finish = on_finish  # called with each finished Job (metrics)
        self.on_refused = on_refused  # called with the status code name of each refusal
        self._ids = itertools.count(1)
        self.api_keys = api_keys
        self._owners: dict[str, str] = {}  # live request id -> the key (id) that made it
        # No tokenizer work on the event loop: prompts in on one thread, text out on another,
        # each with a tokenizer of its own (a large prompt once froze every stream for 7.5 s).
        self._text_in = TextThread(text, "fastserve-text-in")
        self._text_out = TextThread(text, "fastserve-text-out")

    async def _owner(self, context: grpc.aio.ServicerContext) -> str:
        """The caller's key id ("" without keys); UNAUTHENTICATED without a known key."""
        if self.api_keys is None:
            return ""
        owner = self.api_keys.owner(context.invocation_metadata())
        if owner is None:
            await self._refuse(context, grpc.StatusCode.UNAUTHENTICATED,
                               "missing or unknown API key: send the metadata "
                               "'authorization: Bearer <key>'")
        assert owner is not None
        return owner

    async def _refuse(self, context: grpc.aio.ServicerContext, code: grpc.StatusCode,
                      message: str) -> None:
        """Abort the call with ``code``, counted (metrics) by its name."""
        if self.on_refused is not None:
            self.on_refused(code.name)
        await context.abort(code, message)

    async def Generate(self, request: spb.GenerateRequest,
                       context: grpc.aio.ServicerContext) -> AsyncIterator[spb.GenerateResponse]:
        owner = await self._owner(context)
        now = time.monotonic()
        cluster = self.cluster
        group = cluster.pick()
        if group is None:
            await self._refuse(context, grpc.StatusCode.UNAVAILABLE, "no worker is ready")
        request_id = request.request_id or uuid.uuid4().hex  # build_job bounds it
        limits = cluster.limits(group)
        try:
            job, stop = await self._text_in.run(functools.partial(
                build_job, request, job_id=next(self._ids), request_id=request_id,
                now=now, text=self._text_in.text, vocab_size=limits.vocab_size,
                max_context=limits.max_context,
                default_max_tokens=self.config.default_max_tokens,
                eos_token_ids=limits.eos_token_ids | self.text.eos_token_ids))
            detok = await self._text_out.run(functools.partial(
                IncrementalDetokenizer, self._text_out.text, job.prompt, stop,
                min_tokens=job.sampling.min_tokens))
        except InvalidRequest as e:
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT, str(e))
        # Checked after the awaits above, with no await until submit: two requests with one
        # id cannot both pass.
        if cluster.is_live(request_id):
            await self._refuse(context, grpc.StatusCode.INVALID_ARGUMENT,
                               f"request_id: {request_id!r} is already in use by a live request")
        if not cluster.can_admit(group):
            await self._refuse(
                context, grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"the waiting queue is full ({self.config.max_waiting} requests); retry later",
            )
        updates: asyncio.Queue[JobUpdate] = asyncio.Queue()
        cluster.submit(job, group, updates.put_nowait)
        self._owners[request_id] = owner
        stop_string = ""
        try:
            finished = False
            while not finished:
                u = await updates.get()
                ids, lps = list(u.token_ids), list(u.logprobs)
                finished = u.finished
                while not updates.empty() and not finished:  # coalesce a backlog
                    more = updates.get_nowait()
                    ids += more.token_ids
                    lps += more.logprobs
                    finished = more.finished
                finish = finished and job.status != JobStatus.FAILED
                text, stopped = "", False
                if ids or finish:
                    text, stop_string, stopped = await self._text_out.run(
                        _next_text, detok, ids, finish)
                if stopped:
                    cluster.end(request_id, JobStatus.FINISHED_STOPPED)
                    finished = True
                if text or ids:
                    yield spb.GenerateResponse(
                        request_id=request_id,
                        chunk=spb.Chunk(text=text, token_ids=ids, logprobs=lps),
                    )
            if job.worker_lost:
                await context.abort(grpc.StatusCode.UNAVAILABLE, job.error)
            yield spb.GenerateResponse(request_id=request_id, final=self._final(job, stop_string))
        finally:
            if not job.status.finished:  # the client went away or its deadline passed
                cluster.end(request_id, JobStatus.CANCELLED)
            cluster.forget(request_id)
            self._owners.pop(request_id, None)
            if self.on_finish is not None:
                self.on_finish(job)

    def _final(self, job: Job, stop_string: str) -> spb.Final:
        end = job.finish_time or time.monotonic()
        usage = spb.Usage(
            prompt_tokens=len(job.prompt),
            completion_tokens=len(job.output),
            queue_time_s=(job.first_scheduled_time or end) - job.arrival_time,
            time_to_first_token_s=(job.first_token_time or end) - job.arrival_time,
            total_time_s=end - job.arrival_time,
        )
        reason = FINISH.get(job.status, spb.FINISH_REASON_ERROR)
        if stop_string:
            reason = spb.FINISH_REASON_STOP
        return spb.Final(finish_reason=reason,
                         usage=usage, error_message=job.error, stop_string=stop_string,
                         predicted_output_tokens=job.first_predicted_output_tokens)

    async def Cancel(self, request: spb.CancelRequest,
                     context: grpc.aio.ServicerContext) -> spb.CancelResponse:
        owner = await self._owner(context)
        if self._owners.get(request.request_id) != owner:
            return spb.CancelResponse(found=False)  # not this key's: as if unknown
        found = self.cluster.end(request.request_id, JobStatus.CANCELLED)
        return spb.CancelResponse(found=found)

    async def Status(self, request: spb.StatusRequest,
                     context: grpc.aio.ServicerContext) -> spb.StatusResponse:
        await self._owner(context)
        resp = spb.StatusResponse(policy=self.config.policy, max_waiting=self.config.max_waiting,
                                  model=self.model_name, kv_policy=self.config.kv_policy)
        queues: dict[str, int] = {}
        for g in self.cluster.status():
            w = spb.WorkerStatus(address=g.address, state=g.state, healthy=g.ready,
                                 error=g.error, model=g.model, predictor=g.predictor,
                                 tensor_parallel_size=g.tensor_parallel_size,
                                 pipeline_parallel_size=g.pipeline_parallel_size)
            st = g.stats
            if st is not None:
                for name in _WORKER_STATS:
                    setattr(w, name, getattr(st, name))
                w.kv_usage = st.num_used_blocks / st.num_blocks
                w.queues.extend(spb.QueueStatus(name=k, num_jobs=v) for k, v in st.queues)
                resp.num_running += st.num_running
                resp.num_waiting += st.num_waiting
                resp.num_finished += sum(st.num_finished.values())
                for name, n in st.queues:
                    queues[name] = queues.get(name, 0) + n
            resp.workers.append(w)
        resp.queues.extend(spb.QueueStatus(name=k, num_jobs=v) for k, v in queues.items())
        resp.num_orphaned = self.cluster.num_orphaned
        return resp
