"""Per-job error kinds shared by the engine and its swap engine."""

from __future__ import annotations

import enum


class ErrorCode(enum.IntEnum):
    """Per-job error kinds; the values match gRPC status codes."""

    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    ALREADY_EXISTS = 6
    FAILED_PRECONDITION = 9
    RESOURCE_EXHAUSTED = 8
    OUT_OF_RANGE = 11
    INTERNAL = 13
    UNAVAILABLE = 14
    DATA_LOSS = 15


class JobRejected(Exception):
    """One job's entry in a Step cannot be applied; the job is unchanged."""

    def __init__(self, code: ErrorCode, message: str):
        super().__init__(message)
        self.code = code


class KVLost(JobRejected):
    """The job's KV is gone (its upload or offload failed); the job must be dropped."""

    def __init__(self, message: str):
        super().__init__(ErrorCode.DATA_LOSS, message)
