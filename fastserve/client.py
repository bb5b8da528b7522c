"""Python SDK for a FastServe scheduler: ``Client`` (blocking) and ``AsyncClient`` (asyncio).

    with Client("127.0.0.1:50051") as client:
        print(client.generate("Hello", max_tokens=16).text)
        for chunk in client.stream(messages=[{"role": "user", "content": "Hi"}]):
            print(chunk.text, end="", flush=True)

A failed call raises the typed exception of ``fastserve.errors`` for its gRPC status.
A request the server ends with finish reason ERROR after it started is not an exception:
``generate()`` returns its ``Completion`` with ``finish_reason == "error"`` and the server's
message in ``Completion.error``, so the text produced until then is not lost.
"""

from __future__ import annotations

import asyncio
import functools
import os
import pathlib
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypedDict

import grpc
from google.protobuf.json_format import MessageToDict
from grpc_health.v1 import health_pb2, health_pb2_grpc

from fastserve.errors import FastServeError, Unavailable, from_rpc_error
from fastserve.proto import scheduler_pb2 as pb
from fastserve.proto import scheduler_pb2_grpc

if TYPE_CHECKING:
    from typing_extensions import Self, Unpack

__all__ = ["AsyncClient", "Client", "Completion", "GenerateOptions", "GenerationStream",
           "StreamChunk", "Usage", "default_address"]

DEFAULT_ADDRESS = "127.0.0.1:50051"
ADDRESS_ENV = "FASTSERVE_ADDRESS"
HEALTH_SERVICE = "fastserve.v1.Scheduler"
_HEALTH_TIMEOUT_S = 5.0
_CHECK = health_pb2.HealthCheckRequest(service=HEALTH_SERVICE)
_SERVING = health_pb2.HealthCheckResponse.SERVING
# gRPC's reconnect backoff grows to 120 s by default; a client of a restarted scheduler should
# notice within seconds that it is back.
_CHANNEL_OPTIONS = [("grpc.max_reconnect_backoff_ms", 2000)]
# FINISH_REASON_STOP -> "stop", ...; UNSPECIFIED (a server bug) reads as "error".
_FINISH_REASONS = {v: k.removeprefix("FINISH_REASON_").lower() for k, v in pb.FinishReason.items()}
_FINISH_REASONS[pb.FINISH_REASON_UNSPECIFIED] = "error"


API_KEY_ENV = "FASTSERVE_API_KEY"
TLS_CA_ENV = "FASTSERVE_TLS_CA"


def default_address() -> str:
    """The scheduler address used when none is given: ``$FASTSERVE_ADDRESS`` or the default."""
    return os.environ.get(ADDRESS_ENV) or DEFAULT_ADDRESS


@dataclass(frozen=True)
class Usage:
    """Token counts and timings of one request (seconds since it reached the scheduler)."""

    prompt_tokens: int
    completion_tokens: int
    queue_time_s: float
    time_to_first_token_s: float
    total_time_s: float


@dataclass(frozen=True)
class Completion:
    """A finished request. ``finish_reason`` is "stop", "length", "cancelled" or "error" (then
    ``error`` says why); ``stop_string`` is the stop string that ended it, if one did."""

    request_id: str
    text: str
    token_ids: list[int]
    finish_reason: str
    usage: Usage
    stop_string: str = ""
    error: str = ""


@dataclass(frozen=True)
class StreamChunk:
    """New output since the previous chunk; ``text`` may be empty while bytes are held back."""

    request_id: str
    text: str
    token_ids: list[int]
    logprobs: list[float]


class GenerateOptions(TypedDict, total=False):
    """Keyword options of ``generate()`` and ``stream()``; unset ones take the server default.

    ``messages`` ({"role", "content"} dicts, rendered with the model's chat template) replaces
    the positional prompt (text or token ids). ``request_id`` defaults to a fresh random id,
    so it is known before the first chunk arrives.
    """

    messages: Iterable[Mapping[str, str]]
    max_tokens: int
    temperature: float
    top_p: float
    top_k: int
    seed: int
    stop: str | Iterable[str]
    ignore_eos: bool
    min_tokens: int
    request_id: str


def _request(
    prompt: str | Iterable[int] | None = None, *,
    messages: Iterable[Mapping[str, str]] | None = None,
    max_tokens: int | None = None, temperature: float | None = None, top_p: float | None = None,
    top_k: int | None = None, seed: int | None = None, stop: str | Iterable[str] | None = None,
    ignore_eos: bool = False, min_tokens: int | None = None, request_id: str | None = None,
) -> pb.GenerateRequest:
    if (prompt is None) == (messages is None):
        raise ValueError("pass exactly one of prompt (text or token ids) and messages")
    stops = [stop] if isinstance(stop, str) else list(stop or ())
    sampling = pb.SamplingOptions(stop=stops, ignore_eos=ignore_eos)
    for name, value in (("max_tokens", max_tokens), ("temperature", temperature),
                        ("top_p", top_p), ("top_k", top_k), ("seed", seed),
                        ("min_tokens", min_tokens)):
        if value is not None:
            setattr(sampling, name, value)
    req = pb.GenerateRequest(sampling=sampling, request_id=request_id or uuid.uuid4().hex)
    if messages is not None:
        chat = [pb.ChatMessage(role=m["role"], content=m["content"]) for m in messages]
        req.chat.CopyFrom(pb.ChatMessages(messages=chat, add_generation_prompt=True))
    elif isinstance(prompt, str):
        req.text = prompt
    else:
        req.token_ids.ids.extend(prompt)
    return req


def _to_dict(msg: Any) -> dict:
    kwargs = {"preserving_proto_field_name": True, "always_print_fields_with_no_presence": True}
    try:
        return MessageToDict(msg, unquote_int64_if_possible=True, **kwargs)
    except TypeError:  # older protobuf: 64-bit counters stay strings, as in proto3 JSON
        return MessageToDict(msg, **kwargs)


class GenerationStream:
    """One request's ``StreamChunk``s: iterate it (``async for`` when it came from an
    ``AsyncClient``). ``close()``, alias ``cancel()``, also run when a ``with`` / ``async with``
    block ends, cancels the RPC and with it the request on the server; iteration then stops.
    """

    def __init__(self, call: Any, request_id: str) -> None:
        self._call = call
        self._closed = False
        self._texts: list[str] = []
        self._token_ids: list[int] = []
        self.request_id = request_id
        """The request's id (the server's, once it answered)."""
        self.completion: Completion | None = None
        """The finished request once the final message arrived; None before, or if closed."""

    def close(self) -> None:
        """Cancel the RPC (and so the request); a no-op once the stream has ended."""
        if not self._closed:
            self._closed = True
            self._call.cancel()

    cancel = close

    def __iter__(self) -> GenerationStream:
        return self

    def __next__(self) -> StreamChunk:
        while not self._closed:
            try:
                resp = next(self._call)
            except StopIteration:
                break
            except grpc.RpcError as e:
                if self._closed:  # closed from another thread while this one waited
                    break
                raise from_rpc_error(e) from e
            if (chunk := self._add(resp)) is not None:
                return chunk
        raise StopIteration

    def __aiter__(self) -> GenerationStream:
        return self

    async def __anext__(self) -> StreamChunk:
        while not self._closed:
            try:
                resp = await self._call.read()
            except grpc.RpcError as e:
                raise from_rpc_error(e) from e
            if resp is grpc.aio.EOF:
                break
            if (chunk := self._add(resp)) is not None:
                return chunk
        raise StopAsyncIteration

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    def _add(self, resp: pb.GenerateResponse) -> StreamChunk | None:
        self.request_id = resp.request_id or self.request_id
        if resp.HasField("final"):
            final, u = resp.final, resp.final.usage
            usage = Usage(u.prompt_tokens, u.completion_tokens, u.queue_time_s,
                          u.time_to_first_token_s, u.total_time_s)
            self.completion = Completion(
                self.request_id, "".join(self._texts), list(self._token_ids),
                _FINISH_REASONS.get(final.finish_reason, "error"), usage, final.stop_string,
                final.error_message)
            return None
        chunk = resp.chunk
        self._texts.append(chunk.text)
        self._token_ids.extend(chunk.token_ids)
        return StreamChunk(self.request_id, chunk.text, list(chunk.token_ids),
                           list(chunk.logprobs))

    def _result(self) -> Completion:
        if self.completion is None:
            raise FastServeError("the stream ended without a final message")
        return self.completion


class _ClientBase:
    _channel_factory: Any
    _secure_factory: Any

    def __init__(self, address: str | None = None, timeout: float | None = None,
                 api_key: str | None = None, tls_ca: str | None = None) -> None:
        self.address = address or default_address()
        self.timeout = timeout
        key = api_key if api_key is not None else os.environ.get(API_KEY_ENV)
        # Sent with every call as a bearer token (a scheduler started with --api-keys).
        self._metadata = (("authorization", f"Bearer {key}"),) if key else None
        ca = tls_ca if tls_ca is not None else os.environ.get(TLS_CA_ENV)
        # TLS to a scheduler started with --tls-cert: trust this CA file's certificates.
        self._credentials = (grpc.ssl_channel_credentials(pathlib.Path(ca).read_bytes())
                             if ca else None)
        self._channel: Any = None

    def _rpc(self, name: str) -> Any:
        """The stub method ``name`` ("Generate", "Cancel", "Status" or the health "Check")."""
        # Opened on first use because grpc.aio channels must be made in the running loop.
        if self._channel is None:
            if self._credentials is not None:
                self._channel = self._secure_factory(self.address, self._credentials,
                                                     options=_CHANNEL_OPTIONS)
            else:
                self._channel = self._channel_factory(self.address, options=_CHANNEL_OPTIONS)
            self._stubs = (scheduler_pb2_grpc.SchedulerStub(self._channel),
                           health_pb2_grpc.HealthStub(self._channel))
        method = getattr(self._stubs[name == "Check"], name)
        return functools.partial(method, metadata=self._metadata) if self._metadata else method

    def _deadline(self, timeout: float | None) -> float | None:
        return self.timeout if timeout is None else timeout

    def _start(self, prompt: Any, timeout: float | None, options: Any) -> tuple[Any, str]:
        req = _request(prompt, **options)
        return self._rpc("Generate")(req, timeout=self._deadline(timeout)), req.request_id


class Client(_ClientBase):
    """Blocking client of one scheduler at ``address`` (default: ``default_address()``).

    ``timeout`` (seconds) is the default deadline of every call (None: none); a call's own
    ``timeout=`` overrides it. A passed deadline raises ``DeadlineExceeded`` and cancels.
    """

    _channel_factory = staticmethod(grpc.insecure_channel)
    _secure_factory = staticmethod(grpc.secure_channel)

    def stream(self, prompt: str | Iterable[int] | None = None, *, timeout: float | None = None,
               **options: Unpack[GenerateOptions]) -> GenerationStream:
        """Start a request and return its stream of chunks; closing it cancels the request."""
        return GenerationStream(*self._start(prompt, timeout, options))

    def generate(self, prompt: str | Iterable[int] | None = None, *, timeout: float | None = None,
                 **options: Unpack[GenerateOptions]) -> Completion:
        """Run a request to its end and return its Completion (see the module doc on errors)."""
        with self.stream(prompt, timeout=timeout, **options) as stream:
            for _ in stream:
                pass
            return stream._result()

    def cancel(self, request_id: str, timeout: float | None = None) -> bool:
        """Cancel a live request by id; False if no live request has that id."""
        return self._unary("Cancel", pb.CancelRequest(request_id=request_id), timeout).found

    def status(self, timeout: float | None = None) -> dict:
        """The scheduler's StatusResponse as a dict keyed by the proto field names."""
        return _to_dict(self._unary("Status", pb.StatusRequest(), timeout))

    def health(self, timeout: float | None = None, *, wait_for_ready: bool = False) -> bool:
        """True if the scheduler reports SERVING; False if not, or if it cannot be reached
        (``wait_for_ready``: until ``timeout``, wait for it to be reachable)."""
        try:
            t = self._deadline(timeout) or _HEALTH_TIMEOUT_S
            return self._unary("Check", _CHECK, t, wait_for_ready=wait_for_ready).status == _SERVING
        except FastServeError:
            return False

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Block until the scheduler reports SERVING; ``Unavailable`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if self.health(left, wait_for_ready=True):
                return
            time.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        raise Unavailable(f"scheduler at {self.address} not ready after {timeout:g} s")

    def close(self) -> None:
        """Close the channel; live streams end."""
        if self._channel is not None:
            self._channel.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _unary(self, name: str, req: Any, timeout: float | None, **kw: Any) -> Any:
        try:
            return self._rpc(name)(req, timeout=self._deadline(timeout), **kw)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e


class AsyncClient(_ClientBase):
    """asyncio client: ``Client``'s methods as coroutines, ``stream()`` an async iterator.

    Make and use it inside one running event loop (the channel opens on first use).
    """

    _channel_factory = staticmethod(grpc.aio.insecure_channel)
    _secure_factory = staticmethod(grpc.aio.secure_channel)

    def stream(self, prompt: str | Iterable[int] | None = None, *, timeout: float | None = None,
               **options: Unpack[GenerateOptions]) -> GenerationStream:
        """Start a request; ``async for`` over the result for its chunks."""
        return GenerationStream(*self._start(prompt, timeout, options))

    async def generate(self, prompt: str | Iterable[int] | None = None, *,
                       timeout: float | None = None,
                       **options: Unpack[GenerateOptions]) -> Completion:
        """Run a request to its end and return its Completion."""
        async with self.stream(prompt, timeout=timeout, **options) as stream:
            async for _ in stream:
                pass
            return stream._result()

    async def cancel(self, request_id: str, timeout: float | None = None) -> bool:
        """Cancel a live request by id; False if no live request has that id."""
        return (await self._unary("Cancel", pb.CancelRequest(request_id=request_id),
                                  timeout)).found

    async def status(self, timeout: float | None = None) -> dict:
        """The scheduler's StatusResponse as a dict keyed by the proto field names."""
        return _to_dict(await self._unary("Status", pb.StatusRequest(), timeout))

    async def health(self, timeout: float | None = None, *, wait_for_ready: bool = False) -> bool:
        """True if the scheduler reports SERVING; False if not, or if it cannot be reached."""
        try:
            t = self._deadline(timeout) or _HEALTH_TIMEOUT_S
            resp = await self._unary("Check", _CHECK, t, wait_for_ready=wait_for_ready)
        except FastServeError:
            return False
        return resp.status == _SERVING

    async def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the scheduler reports SERVING; ``Unavailable`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            if await self.health(left, wait_for_ready=True):
                return
            await asyncio.sleep(min(0.2, max(0.0, deadline - time.monotonic())))
        raise Unavailable(f"scheduler at {self.address} not ready after {timeout:g} s")

    async def close(self) -> None:
        """Close the channel; live streams end."""
        if self._channel is not None:
            await self._channel.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    async def _unary(self, name: str, req: Any, timeout: float | None, **kw: Any) -> Any:
        try:
            return await self._rpc(name)(req, timeout=self._deadline(timeout), **kw)
        except grpc.RpcError as e:
            raise from_rpc_error(e) from e
