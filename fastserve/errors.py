"""Typed exceptions for the gRPC status codes a FastServe call can end with.

Every ``grpc.RpcError`` the SDK sees is re-raised as one of these (``raise ... from e``), so
callers can write ``except ResourceExhausted:`` and still read ``.code`` and ``.details``.
"""

from __future__ import annotations

import grpc


class FastServeError(Exception):
    """A failed FastServe call: the gRPC status ``code`` and the server's ``details``."""

    default_code = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str, code: grpc.StatusCode | None = None) -> None:
        self.code: grpc.StatusCode = code if code is not None else self.default_code
        self.details = details
        super().__init__(f"{self.code.name}: {details}")


class InvalidArgument(FastServeError):
    """The request was rejected; ``details`` names the field and the limit."""

    default_code = grpc.StatusCode.INVALID_ARGUMENT


class ResourceExhausted(FastServeError):
    """The scheduler's waiting queue is full; retry later."""

    default_code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(FastServeError):
    """The scheduler cannot be reached, or it has no healthy worker."""

    default_code = grpc.StatusCode.UNAVAILABLE


class NotFound(FastServeError):
    """The named object (a request id, a model) does not exist."""

    default_code = grpc.StatusCode.NOT_FOUND


class DeadlineExceeded(FastServeError):
    """The call's ``timeout`` passed before it finished (the request is cancelled)."""

    default_code = grpc.StatusCode.DEADLINE_EXCEEDED


class Cancelled(FastServeError):
    """The RPC was cancelled (by the server, or by the channel closing)."""

    default_code = grpc.StatusCode.CANCELLED


class Unauthenticated(FastServeError):
    """The scheduler wants an API key this client did not send (or sent a wrong one)."""

    default_code = grpc.StatusCode.UNAUTHENTICATED


_BY_CODE: dict[grpc.StatusCode, type[FastServeError]] = {
    cls.default_code: cls
    for cls in (InvalidArgument, ResourceExhausted, Unavailable, NotFound, DeadlineExceeded,
                Cancelled, Unauthenticated)
}


def from_rpc_error(e: grpc.RpcError) -> FastServeError:
    """Return the typed exception for ``e``; codes without a subclass give ``FastServeError``."""
    # A bare grpc.RpcError (not a grpc.Call) has neither code() nor details().
    code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
    details = e.details() if callable(getattr(e, "details", None)) else None
    return _BY_CODE.get(code, FastServeError)(details or str(e) or code.name, code)
