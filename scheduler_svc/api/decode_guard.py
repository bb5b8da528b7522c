"""Requests that do not decode are the client's error: INVALID_ARGUMENT, not UNKNOWN.

gRPC deserializes a request before any servicer code runs, and a protobuf decode error there
(a string field holding invalid UTF-8, or bytes that are no message at all) reached clients
as UNKNOWN "Exception deserializing request!". This interceptor wraps the deserializers of
the services it guards: an undecodable request becomes an ``Undecodable`` marker, and the
method answers it with INVALID_ARGUMENT and a message naming the message type.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc
from google.protobuf.message import DecodeError


class Undecodable:
    def __init__(self, error: str):
        self.error = error


def _safe(deserializer: Callable[[bytes], Any]) -> Callable[[bytes], Any]:
    def run(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError as e:
            return Undecodable(str(e))
    return run


def _message(method: str, request: Undecodable) -> str:
    return (f"the request to {method} could not be decoded ({request.error}); string fields "
            "must be valid UTF-8")


class DecodeGuard(grpc.aio.ServerInterceptor):
    """Guards the unary-request methods of the services whose full names start with one of
    ``prefixes`` (their stream methods are async generators, their unary ones coroutines)."""

    def __init__(self, prefixes: tuple[str, ...]):
        self._prefixes = tuple(f"/{p}" for p in prefixes)

    async def intercept_service(
        self, continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Any]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Any:
        handler = await continuation(handler_call_details)
        method = handler_call_details.method
        if (handler is None or handler.request_deserializer is None
                or not method.startswith(self._prefixes)):
            return handler
        safe = _safe(handler.request_deserializer)
        if handler.unary_unary is not None:
            inner = handler.unary_unary

            async def unary(request: Any, context: grpc.aio.ServicerContext) -> Any:
                if isinstance(request, Undecodable):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        _message(method, request))
                return await inner(request, context)
            return handler._replace(request_deserializer=safe, unary_unary=unary)
        if handler.unary_stream is not None:
            inner_stream = handler.unary_stream

            async def stream(request: Any, context: grpc.aio.ServicerContext
                             ) -> AsyncIterator[Any]:
                if isinstance(request, Undecodable):
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                        _message(method, request))
                async for response in inner_stream(request, context):
                    yield response
            return handler._replace(request_deserializer=safe, unary_stream=stream)
        return handler
