"""The worker's link to its node's KV store: a client connected in the background."""

from __future__ import annotations

import logging
import threading
import time

from fastserve.tls import Tls
from kvstore_svc.client import (
    ChecksumMismatch,
    KVStoreClient,
    KVStoreError,
    StoreFull,
    StoreUnavailable,
)
from worker_svc.errors import ErrorCode, JobRejected

log = logging.getLogger(__name__)

# After a failed connect, the next swap tries again only after this long, so that a store that
# is down costs one refused connection per interval rather than one per swap.
RECONNECT_INTERVAL_S = 0.5


def failure_reason(e: BaseException) -> str:
    """A short failure reason for metrics, from the store client's exception."""
    for kind, name in ((StoreFull, "store_full"), (StoreUnavailable, "store_unavailable"),
                       (ChecksumMismatch, "checksum_mismatch")):
        if isinstance(e, kind):
            return name
    if isinstance(e, KVStoreError):
        return e.code.name.lower()  # e.g. not_found: the store restarted, the handles are gone
    return "internal"


class StoreLink:
    """The client of the node's store, connected in the background so no Step ever waits.

    The first attempt starts with the worker; while there is no client, a swap fails
    UNAVAILABLE and starts another attempt (at most one per RECONNECT_INTERVAL_S). Once built,
    the client is kept: it re-registers by itself after a store restart.
    """

    def __init__(self, address: str | None, client_id: str, block_bytes: int,
                 prefer_shm: bool = True, timeout_s: float = 10.0, tls: Tls | None = None):
        self.address = address
        self.tls = tls
        self.client_id = client_id
        self.prefer_shm = prefer_shm
        self.block_bytes = block_bytes
        self.timeout_s = timeout_s
        self.client: KVStoreClient | None = None
        self._lock = threading.Lock()
        self._connected = threading.Event()
        self._connecting = False
        self._closed = False
        self._next_try = 0.0

    def get(self) -> KVStoreClient:
        """The connected client; raises JobRejected(UNAVAILABLE) when there is none yet."""
        if self.client is not None:
            return self.client
        if self.address is None:
            raise JobRejected(ErrorCode.UNAVAILABLE, "no kvstore configured (worker --kvstore)")
        self.connect()
        raise JobRejected(ErrorCode.UNAVAILABLE,
                          f"kvstore {self.address} is not connected (unreachable so far; "
                          "retrying in the background)")

    def connect(self) -> None:
        """Start a connection attempt in the background, unless one is due later or running."""
        with self._lock:
            if (self.address is None or self.client is not None or self._connecting
                    or self._closed or time.monotonic() < self._next_try):
                return
            self._connecting = True
        threading.Thread(target=self._connect, name="kvstore-connect", daemon=True).start()

    def wait_connected(self, timeout_s: float) -> bool:
        self.connect()
        return self._connected.wait(timeout_s)

    def _connect(self) -> None:
        assert self.address is not None
        client = None
        try:
            # Waits up to timeout_s for a store that is starting.
            client = KVStoreClient(self.address, client_id=self.client_id,
                                   block_bytes=self.block_bytes, prefer_shm=self.prefer_shm,
                                   timeout_s=self.timeout_s, tls=self.tls)
        except Exception as e:  # noqa: BLE001 - any failure means "not connected, retry later"
            log.warning("kvstore %s unavailable: %s", self.address, e)
        with self._lock:
            self._connecting = False
            self._next_try = time.monotonic() + RECONNECT_INTERVAL_S
            if client is not None and not self._closed:
                self.client = client
                self._connected.set()
                client = None
                log.info("kvstore %s connected: %d blocks of %d bytes, %s", self.address,
                         self.client.capacity_blocks, self.client.block_bytes,
                         "same node (shared memory)" if self.client.same_node else "remote")
        if client is not None:  # closed while connecting
            client.close()

    def close(self) -> None:
        with self._lock:
            self._closed = True
            client, self.client = self.client, None
        if client is not None:
            client.close()  # releases the lease: the store frees every block it still holds
