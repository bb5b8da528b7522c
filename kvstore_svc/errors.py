"""What a ``KVStoreClient`` call raises: the gRPC status of a store call, as an exception."""

from __future__ import annotations

import grpc


class KVStoreError(Exception):
    """A refused or failed store call; ``code`` is its gRPC status code."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(message)
        self.code = code


class StoreFull(KVStoreError):
    """RESOURCE_EXHAUSTED: not enough free blocks; nothing was allocated."""


class StoreUnavailable(KVStoreError):
    """The store is unreachable (down, restarting, or not answering in time)."""


class ChecksumMismatch(KVStoreError):
    """DATA_LOSS: a block's bytes do not match the checksum recorded when it was written."""
