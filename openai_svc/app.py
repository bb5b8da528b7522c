"""The FastAPI application: OpenAI's routes over one gRPC channel to the scheduler.

FastAPI (on Starlette, served by uvicorn) because it is the stack vLLM and SGLang serve their
OpenAI APIs with: pydantic request models give typed 400s naming the field, and Starlette's
streaming response notices a client that goes away (its generator is cancelled, and with it
the gRPC call, so the scheduler cancels the job within an iteration).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    generate_latest,
)
from starlette.exceptions import HTTPException as StarletteHTTPException

from fastserve.proto import scheduler_pb2 as spb
from fastserve.proto import scheduler_pb2_grpc
from openai_svc.errors import ApiError, from_rpc
from openai_svc.protocol import ChatCompletionRequest, CompletionRequest
from openai_svc.responses import DONE, Shape, sse

log = logging.getLogger(__name__)

# Room for any request the body limit lets through (gRPC's own caps are 4 MiB).
_CHANNEL_OPTIONS = [("grpc.max_receive_message_length", 64 << 20),
                    ("grpc.max_send_message_length", 64 << 20)]
HEALTH_TIMEOUT_S = 2.0


@dataclass
class Backend:
    """The scheduler as this service reaches it."""

    address: str
    credentials: grpc.ChannelCredentials | None = None  # TLS to the scheduler
    channel: Any = None
    stub: Any = None
    health: Any = None
    model: str = ""  # the served model's name, from the scheduler's Status
    # The model (name or directory) whose tokenizer gives logprobs' token texts, resolved on
    # the first request that asks; None: they read "token_id:N".
    tokenizer_model: str | None = None

    async def open(self) -> None:
        self.channel = (grpc.aio.secure_channel(self.address, self.credentials,
                                                options=_CHANNEL_OPTIONS)
                        if self.credentials is not None
                        else grpc.aio.insecure_channel(self.address, options=_CHANNEL_OPTIONS))
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)
        self.health = health_pb2_grpc.HealthStub(self.channel)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.requests = Counter("fastserve_http_requests", "HTTP requests by route and status",
                                ["route", "status"], registry=self.registry)
        self.latency = Histogram("fastserve_http_request_seconds",
                                 "Time from an HTTP request to its last byte, by route",
                                 ["route"], registry=self.registry,
                                 buckets=(0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120))
        self.ttft = Histogram("fastserve_http_time_to_first_token_seconds",
                              "Time from an HTTP request to its first streamed token",
                              registry=self.registry,
                              buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))


def _metadata(request: Request) -> tuple | None:
    """The caller's API key, passed on: the scheduler authenticates it."""
    auth = request.headers.get("authorization")
    return (("authorization", auth),) if auth else None


def create_app(backend: Backend) -> FastAPI:
    metrics = Metrics()

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        if backend.channel is None:
            await backend.open()
        yield
        await backend.channel.close()

    app = FastAPI(title="FastServe OpenAI-compatible API", lifespan=lifespan,
                  docs_url=None, redoc_url=None)
    app.state.metrics = metrics

    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        metrics.requests.labels(request.url.path, str(e.status)).inc()
        return e.response()

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
        metrics.requests.labels(request.url.path, str(e.status_code)).inc()
        message = f"{request.method} {request.url.path}: {e.detail}"
        return ApiError(e.status_code, message).response()

    @app.exception_handler(RequestValidationError)
    async def invalid_body(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid body"}
        if first.get("type") == "json_invalid":
            err = ApiError(400, f"body: not valid JSON ({first.get('msg')})")
        else:
            # The field's path: a union's failed branches add their type names, and list
            # items their index (kept as [i]).
            parts: list[str] = []
            for x in first.get("loc", ())[1:]:
                if isinstance(x, int):
                    parts[-1:] = [f"{parts[-1] if parts else ''}[{x}]"]
                elif not x[:1].isupper() and not any(c in x for c in "[(,"):
                    parts.append(x)
            param = ".".join(parts) or None
            err = ApiError(400, f"{param or 'body'}: {first.get('msg', 'invalid')}", param)
        metrics.requests.labels(request.url.path, "400").inc()
        return err.response()

    @app.get("/health")
    async def health() -> Response:
        try:
            r = await backend.health.Check(health_pb2.HealthCheckRequest(),
                                           timeout=HEALTH_TIMEOUT_S)
            ok = r.status == health_pb2.HealthCheckResponse.SERVING
        except grpc.RpcError:
            ok = False
        if not ok:
            raise ApiError(503, "no worker is ready to serve", code="unavailable")
        return JSONResponse({"status": "ok"})

    @app.get("/metrics")
    async def prometheus() -> Response:
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models(request: Request) -> JSONResponse:
        status = await _status(backend, request)
        metrics.requests.labels("/v1/models", "200").inc()
        return JSONResponse({"object": "list", "data": [
            {"id": status.model, "object": "model", "created": 0, "owned_by": "fastserve"}]})

    @app.post("/v1/chat/completions")
    async def chat(body: ChatCompletionRequest, request: Request) -> Response:
        return await _generate(backend, metrics, request, body, "chat", body.logprobs)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request) -> Response:
        return await _generate(backend, metrics, request, body, "completion",
                               body.logprobs is not None)

    return app


async def _status(backend: Backend, request: Request) -> spb.StatusResponse:
    try:
        status = await backend.stub.Status(spb.StatusRequest(), timeout=HEALTH_TIMEOUT_S,
                                           metadata=_metadata(request))
    except grpc.RpcError as e:
        raise from_rpc(e) from None
    backend.model = status.model
    return status


async def _check_model(backend: Backend, request: Request, model: str) -> None:
    if not backend.model:
        await _status(backend, request)
    if model != backend.model:
        raise ApiError(404, f"model: {model!r} is not served here; this server serves "
                       f"{backend.model!r} (GET /v1/models)", "model", "model_not_found")


@functools.lru_cache(maxsize=4)
def _load_tokenizer(model: str) -> Any:
    """The tokenizer of ``model`` (a directory, or a name the model cache resolves), or None
    when this host cannot get it."""
    from transformers import AutoTokenizer

    from fastserve.models import resolve_model

    try:
        return AutoTokenizer.from_pretrained(resolve_model(model))
    except (OSError, ValueError) as e:
        log.warning("no tokenizer for %s here (%s): logprobs give token ids", model, e)
        return None


async def _token_texts(backend: Backend) -> Any:
    """id -> text for logprobs: the model's tokenizer when this host has it, else the ids."""
    tok = (await asyncio.to_thread(_load_tokenizer, backend.tokenizer_model)
           if backend.tokenizer_model is not None else None)
    if tok is None:
        return lambda t: f"token_id:{t}"
    return lambda t: tok.decode([t])


async def _generate(backend: Backend, metrics: Metrics, request: Request,
                    body: ChatCompletionRequest | CompletionRequest, kind: str,
                    logprobs: bool) -> Response:
    route = request.url.path
    start = time.perf_counter()
    await _check_model(backend, request, body.model)
    rid = body.request_id or uuid.uuid4().hex
    req = body.to_grpc(rid)
    token_text = await _token_texts(backend) if logprobs else (lambda t: "")
    shape = Shape(kind, rid, backend.model, logprobs, token_text)
    call = backend.stub.Generate(req, metadata=_metadata(request))
    # The first message: a refusal (bad input, key, queue full) is an HTTP error, not a
    # stream that starts with 200 and then fails.
    try:
        first = await _unless_gone(call.read(), call, request)
    except grpc.RpcError as e:
        raise from_rpc(e) from None
    if body.stream:
        return StreamingResponse(
            _events(call, first, shape, body.include_usage(), metrics, route, start),
            media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
    try:
        resp = await _unless_gone(_whole(call, first, shape), call, request)
    except grpc.RpcError as e:
        raise from_rpc(e) from None
    finally:
        call.cancel()  # a no-op once finished
        metrics.latency.labels(route).observe(time.perf_counter() - start)
    metrics.requests.labels(route, "200").inc()
    return resp


async def _unless_gone(work: Any, call: Any, request: Request) -> Any:
    """Await ``work`` unless the client disconnects first: then the call (and with it the
    job) is cancelled."""

    async def disconnected() -> None:
        while (await request.receive())["type"] != "http.disconnect":
            pass

    task = asyncio.ensure_future(work)
    gone = asyncio.ensure_future(disconnected())
    try:
        await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not task.done():
        call.cancel()
        task.cancel()
        raise ApiError(499, "the client closed the request")
    return task.result()


async def _events(call: Any, first: Any, shape: Shape, include_usage: bool, metrics: Metrics,
                  route: str, start: float) -> AsyncIterator[bytes]:
    """The SSE stream; cancelled by Starlette when the client goes away (so is the call)."""
    status = "200"
    try:
        if shape.kind == "chat":
            yield sse(shape.first(include_usage))
        msg = first
        seen_token = False
        while msg is not grpc.aio.EOF:
            if msg.HasField("final"):
                yield sse(shape.last(msg.final, include_usage))
                if include_usage:
                    yield sse(shape.usage_chunk(msg.final))
                break
            if not seen_token and msg.chunk.token_ids:
                seen_token = True
                metrics.ttft.observe(time.perf_counter() - start)
            yield sse(shape.chunk(msg.chunk, include_usage))
            msg = await call.read()
        yield DONE
    except grpc.RpcError as e:  # the stream broke after it began: an error event, as vLLM
        err = from_rpc(e)
        status = str(err.status)
        yield sse(err.body())
        yield DONE
    except ApiError as err:  # an error finish
        status = str(err.status)
        yield sse(err.body())
        yield DONE
    finally:
        call.cancel()  # a no-op once finished; otherwise the client left: cancel the job
        metrics.requests.labels(route, status).inc()
        metrics.latency.labels(route).observe(time.perf_counter() - start)


async def _whole(call: Any, first: Any, shape: Shape) -> JSONResponse:
    """The non-streamed response: every chunk collected."""
    texts: list[str] = []
    ids: list[int] = []
    lps: list[float] = []
    msg = first
    while msg is not grpc.aio.EOF:
        if msg.HasField("final"):
            return JSONResponse(shape.whole("".join(texts), ids, lps, msg.final))
        texts.append(msg.chunk.text)
        ids.extend(msg.chunk.token_ids)
        lps.extend(msg.chunk.logprobs)
        msg = await call.read()
    raise ApiError(502, "the scheduler ended the stream without a final message")
