"""The scheduler's gRPC status -> OpenAI's HTTP status, error type and param."""

from __future__ import annotations

import grpc
import pytest

from openai_svc.errors import from_rpc


class FakeRpcError(grpc.RpcError):
    def __init__(self, code, details):
        self._code, self._details = code, details

    def code(self):
        return self._code

    def details(self):
        return self._details


@pytest.mark.parametrize("code,status,kind", [
    (grpc.StatusCode.INVALID_ARGUMENT, 400, "invalid_request_error"),
    (grpc.StatusCode.UNAUTHENTICATED, 401, "authentication_error"),
    (grpc.StatusCode.NOT_FOUND, 404, "not_found_error"),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, 429, "rate_limit_error"),
    (grpc.StatusCode.UNAVAILABLE, 503, "service_unavailable"),
    (grpc.StatusCode.DEADLINE_EXCEEDED, 504, "timeout"),
    (grpc.StatusCode.INTERNAL, 500, "api_error"),
])
def test_status_codes_map_as_openai_clients_expect(code, status, kind):
    e = from_rpc(FakeRpcError(code, "the waiting queue is full (8 requests); retry later"))
    assert (e.status, e.body()["error"]["type"]) == (status, kind)
    assert e.body()["error"]["message"].startswith("the waiting queue is full")


@pytest.mark.parametrize("details,param", [
    ("sampling.temperature must be in [0, 100], got -1.0", "temperature"),
    ("sampling.stop: entry 0 is empty; stop strings must be non-empty", "stop"),
    ("text: 70000 bytes; the limit is 65536", "prompt"),
    ("token_ids.ids[0] = 5 is outside [0, 4)", "prompt"),
    ("chat.messages[3].role: 'robot' is not one of system, user", "messages"),
    ("request_id: 300 characters; the limit is 256", "request_id"),
    ("something without a field", None),
])
def test_the_field_named_first_becomes_the_param(details, param):
    assert from_rpc(FakeRpcError(grpc.StatusCode.INVALID_ARGUMENT, details)).param == param
