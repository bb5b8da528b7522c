"""Errors in OpenAI's JSON shape, with the HTTP status a client of the OpenAI API expects.

``{"error": {"message": ..., "type": ..., "param": ..., "code": ...}}``; the scheduler's
gRPC status maps to HTTP as below, its details (which name the field and the limit) become the
message, and the field they start with becomes ``param``.
"""

from __future__ import annotations

import re

import grpc
from fastapi.responses import JSONResponse

HTTP_OF = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
TYPE_OF = {400: "invalid_request_error", 401: "authentication_error",
           403: "permission_error", 404: "not_found_error", 429: "rate_limit_error",
           503: "service_unavailable", 504: "timeout"}
# The scheduler's field names, then the OpenAI parameter they come from.
_PARAM = {"sampling.max_tokens": "max_tokens", "sampling.temperature": "temperature",
          "sampling.top_p": "top_p", "sampling.top_k": "top_k", "sampling.seed": "seed",
          "sampling.stop": "stop", "sampling.min_tokens": "min_tokens", "text": "prompt",
          "token_ids.ids": "prompt",
          "chat.messages": "messages", "chat": "messages", "prompt": "prompt",
          "request_id": "request_id"}
_FIELD = re.compile(r"^([a-z_.]+)")


class ApiError(Exception):
    """An HTTP error to send as OpenAI does; ``param`` names the offending field."""

    def __init__(self, status: int, message: str, param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": TYPE_OF.get(self.status, "api_error"),
                          "param": self.param, "code": self.code}}

    def response(self) -> JSONResponse:
        return JSONResponse(self.body(), status_code=self.status)


def from_rpc(e: grpc.RpcError) -> ApiError:
    """The ApiError for a failed scheduler call."""
    code = e.code() if callable(getattr(e, "code", None)) else grpc.StatusCode.UNKNOWN
    details = (e.details() if callable(getattr(e, "details", None)) else None) or code.name
    status = HTTP_OF.get(code, 500)
    param = None
    if status == 400 and (m := _FIELD.match(details)):
        param = _PARAM.get(m.group(1).rstrip("."))
    return ApiError(status, details, param, code.name.lower())
