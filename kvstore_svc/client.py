"""``KVStoreClient``: one worker's lease on its node's KV store, and the block copies.

On the store's node the client maps the store's shared-memory pool and copies blocks straight
into and out of their slots: a write is the copy plus one Seal RPC carrying the checksums, a
read is one GetChecksums RPC plus the copy, verified. Elsewhere (or with ``prefer_shm=False``)
the same calls stream the bytes over gRPC. Every block is checksummed with xxh3_64 by its
writer and verified by its reader; ``transfer.py`` moves the bytes.

The client is thread-safe: a copy thread may write and read while another allocates and frees.
It keeps which handles it holds (per job), so that it never copies into a slot it does not own
and so that freeing a handle waits for this client's copies of it to finish.

When the store restarts or the lease expires, the next call (or the keepalive thread, first)
registers again and maps the new segment. Handles of the old lease are gone: calls naming them
raise ``KVStoreError`` with code NOT_FOUND. While the store is unreachable, calls raise
``StoreUnavailable``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import grpc
import numpy as np
import torch
import xxhash

from fastserve.proto import kvstore_pb2 as pb
from fastserve.proto import kvstore_pb2_grpc
from fastserve.tls import Tls, channel
from kvstore_svc import shm, transfer
from kvstore_svc.errors import ChecksumMismatch, KVStoreError, StoreFull, StoreUnavailable
from kvstore_svc.protocol import CHANNEL_OPTIONS, ERROR_KEY, LEASE_UNKNOWN

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["ChecksumMismatch", "KVStoreClient", "KVStoreError", "StoreFull", "StoreUnavailable"]

log = logging.getLogger(__name__)

# Reconnect quickly after the store restarts: gRPC's default backoff grows to two minutes,
# during which every call would fail UNAVAILABLE without trying.
_RECONNECT_OPTIONS = [
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
# A stream's deadline: timeout_s plus its bytes at this rate, so a large transfer is not cut.
_MIN_STREAM_BYTES_PER_S = 100e6


class _LeaseLost(KVStoreError):
    """The store no longer knows the lease a call named; a new lease is in place."""


@dataclass(frozen=True)
class _Lease:
    lease_id: int
    ttl_s: float
    block_bytes: int
    capacity_blocks: int
    slot_mask: int
    max_chunk_bytes: int
    # [capacity_blocks, block_bytes] over the mapped segment; None: the gRPC path.
    slots: np.ndarray | None

    def slot(self, handle: int) -> np.ndarray:
        assert self.slots is not None
        return self.slots[handle & self.slot_mask]


def _check_grant(r: pb.RegisterResponse, requested_block_bytes: int) -> None:
    """Refuse a Register answer whose sizes this client cannot use safely (a store is another
    process: what it says is checked before memory is mapped or indexed by it)."""
    problems = []
    if requested_block_bytes and r.block_bytes != requested_block_bytes:
        problems.append(f"block_bytes {r.block_bytes}, not the {requested_block_bytes} asked")
    if r.capacity_blocks < 1 or r.block_bytes < 1 or r.max_chunk_bytes < 1:
        problems.append(f"capacity_blocks {r.capacity_blocks}, block_bytes {r.block_bytes}, "
                        f"max_chunk_bytes {r.max_chunk_bytes}: each at least 1")
    if not 1 <= r.slot_bits <= 62 or (1 << r.slot_bits) < r.capacity_blocks:
        problems.append(f"slot_bits {r.slot_bits} cannot number {r.capacity_blocks} slots")
    if r.segment_bytes != r.capacity_blocks * r.block_bytes:
        problems.append(f"segment_bytes {r.segment_bytes}, not capacity_blocks x block_bytes")
    if problems:
        raise KVStoreError(grpc.StatusCode.FAILED_PRECONDITION,
                           "the store's Register answer is unusable: " + "; ".join(problems))


class KVStoreClient:
    """A lease on the store at ``address`` for blocks of ``block_bytes``.

    Connects and registers (waiting up to ``timeout_s`` for the store to come up), maps the
    store's pool when this node can open it and ``prefer_shm``, and renews the lease from a
    daemon thread every ttl/3. ``copy_threads`` threads copy and checksum blocks on the
    same-node path. Raises ``StoreUnavailable`` when the store cannot be reached and
    ``KVStoreError`` (FAILED_PRECONDITION) when its block size is another.
    """

    def __init__(self, address: str, *, client_id: str, block_bytes: int,
                 prefer_shm: bool = True, timeout_s: float = 10.0, copy_threads: int = 2,
                 tls: Tls | None = None):
        if block_bytes < 1:
            raise ValueError(f"block_bytes must be at least 1, got {block_bytes}")
        if copy_threads < 1:
            raise ValueError(f"copy_threads must be at least 1, got {copy_threads}")
        self.address = address
        self.client_id = client_id
        self.prefer_shm = prefer_shm
        self.timeout_s = timeout_s
        self._requested_block_bytes = block_bytes
        self._channel = channel(address, tls, CHANNEL_OPTIONS + _RECONNECT_OPTIONS)
        self._stub = kvstore_pb2_grpc.KVStoreStub(self._channel)
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)  # notified when copies of handles end
        self._jobs: dict[int, set[int]] = {}  # job_key -> handles held, this lease
        self._job_of: dict[int, int] = {}  # handle -> job_key, this lease
        self._busy: dict[int, int] = {}  # handle -> copies of it in flight
        try:
            self._lease = self._register(wait=True)
        except BaseException:
            self._channel.close()
            raise
        self._copy_threads = copy_threads
        self._copier = (ThreadPoolExecutor(copy_threads, thread_name_prefix="kvstore-copy")
                        if copy_threads > 1 else None)
        self._closed = threading.Event()
        self._keepalive = threading.Thread(target=self._keep_alive, daemon=True,
                                           name=f"kvstore-keepalive-{client_id}")
        self._keepalive.start()

    # -- what the lease gives ------------------------------------------------------------

    @property
    def same_node(self) -> bool:
        """True when blocks are copied through the mapped pool rather than over gRPC."""
        return self._lease.slots is not None

    @property
    def capacity_blocks(self) -> int:
        return self._lease.capacity_blocks

    @property
    def block_bytes(self) -> int:
        return self._lease.block_bytes

    @property
    def lease_id(self) -> int:
        return self._lease.lease_id

    # -- blocks --------------------------------------------------------------------------

    def allocate(self, job_key: int, n: int) -> list[int]:
        """``n`` new handles for ``job_key``, all or nothing; raises ``StoreFull``."""
        try:
            return self._allocate(job_key, n)
        except _LeaseLost:
            return self._allocate(job_key, n)  # registered again, holding nothing: retry once

    def write(self, handles: Sequence[int], data: torch.Tensor) -> None:
        """Store ``data`` [n, block_bytes] uint8 (CPU) as the blocks of ``handles``."""
        src = transfer.as_rows(data, len(handles), self.block_bytes, "data")
        if src.strides[1] != 1:
            src = np.ascontiguousarray(src)
        with self._pinned(handles) as lease:
            if lease.slots is not None:
                sums = transfer.copy_blocks([lease.slot(h) for h in handles], src,
                                            self._copier, self._copy_threads)
                self._seal(lease, handles, sums)
            else:
                with self._rpc_errors(lease):
                    transfer.stream_write(self._stub, lease.lease_id, handles, src,
                                          lease.max_chunk_bytes,
                                          self._stream_timeout(src.nbytes))

    def views(self, handles: Sequence[int]) -> list[torch.Tensor]:
        """Zero-copy uint8 [block_bytes] tensors over the slots of ``handles`` (same node only).

        For a caller that fills the slots itself (e.g. a device-to-host copy); it must then
        call ``seal(handles)``. The views stay valid memory even after the store goes away.
        """
        with self._pinned(handles) as lease:
            if lease.slots is None:
                raise KVStoreError(grpc.StatusCode.FAILED_PRECONDITION,
                                   f"views need the store's shared memory, which this client "
                                   f"has not mapped (store at {self.address} is on another "
                                   "node, or prefer_shm=False); use write()")
            return [torch.from_numpy(lease.slot(h)) for h in handles]

    def seal(self, handles: Sequence[int]) -> None:
        """Checksum the slots of ``handles`` (filled through ``views``) and make them readable."""
        with self._pinned(handles) as lease:
            if lease.slots is None:
                raise KVStoreError(grpc.StatusCode.FAILED_PRECONDITION,
                                   "seal is for blocks filled through views(), which need the "
                                   "store's shared memory; write() seals by itself")
            slots = [lease.slot(h) for h in handles]
            if self._copier is not None and len(slots) > 1:
                sums = list(self._copier.map(xxhash.xxh3_64_intdigest, slots))
            else:
                sums = [xxhash.xxh3_64_intdigest(s) for s in slots]
            self._seal(lease, handles, sums)

    def read(self, handles: Sequence[int], out: torch.Tensor) -> None:
        """Fill ``out`` [n, block_bytes] uint8 (CPU) with the blocks of ``handles``, verified.

        Raises ``ChecksumMismatch`` naming the first bad handle, and KVStoreError
        FAILED_PRECONDITION for a block that was never written.
        """
        dst = transfer.as_rows(out, len(handles), self.block_bytes, "out")
        staged = dst if dst.strides[1] == 1 else np.empty(dst.shape, np.uint8)
        with self._pinned(handles, owned=False) as lease:
            if lease.slots is not None:
                r = self._call(lease, self._stub.GetChecksums,
                               pb.GetChecksumsRequest(lease_id=lease.lease_id, handles=handles))
                sums = transfer.copy_blocks(staged, [lease.slot(h) for h in handles],
                                            self._copier, self._copy_threads)
                for h, got, want in zip(handles, sums, r.checksums):
                    if got != want:
                        raise ChecksumMismatch(grpc.StatusCode.DATA_LOSS,
                                               f"handle {h}: read back with xxh3_64 {got:#x}, "
                                               f"but it was sealed with {want:#x} (corrupted in "
                                               "host memory, or rewritten while being read)")
            else:
                with self._rpc_errors(lease):
                    transfer.stream_read(self._stub, lease.lease_id, handles, staged,
                                         self._stream_timeout(staged.nbytes))
        if staged is not dst:
            np.copyto(dst, staged)

    def free(self, handles: Sequence[int]) -> None:
        """Free ``handles``, all or nothing; waits for this client's copies of them first."""
        with self._lock:
            self._idle.wait_for(lambda: not any(h in self._busy for h in handles))
            lease = self._lease
            jobs = {h: self._job_of.pop(h) for h in handles if h in self._job_of}
            for h, job in jobs.items():
                self._forget(h, job)
        try:
            self._call(lease, self._stub.Free,
                       pb.FreeRequest(lease_id=lease.lease_id, handles=handles))
        except _LeaseLost:
            raise
        except KVStoreError:
            self._restore(lease, jobs)  # refused all or nothing: the store still holds them
            raise

    def free_job(self, job_key: int) -> int:
        """Free every handle of ``job_key``; returns how many the store freed (0 when the
        lease holding them was lost: the store freed them with it)."""
        with self._lock:
            held = self._jobs.get(job_key, set())
            self._idle.wait_for(lambda: not any(h in self._busy for h in held))
            lease = self._lease
            jobs = dict.fromkeys(self._jobs.pop(job_key, ()), job_key)
            for h in jobs:
                del self._job_of[h]
        try:
            r = self._call(lease, self._stub.FreeJob,
                           pb.FreeJobRequest(lease_id=lease.lease_id, job_key=job_key))
        except _LeaseLost:
            return 0  # the new lease holds nothing of it
        except KVStoreError:
            self._restore(lease, jobs)  # the store may still hold them
            raise
        return len(r.handles)

    def stats(self) -> dict[str, Any]:
        """The store's usage: budget, block size, used/free blocks and bytes, every lease."""
        try:
            s = self._stub.Stats(pb.StatsRequest(), timeout=self.timeout_s)
        except grpc.RpcError as e:
            raise self._error(e) from None
        return {
            "budget_bytes": s.budget_bytes, "block_bytes": s.block_bytes,
            "capacity_blocks": s.capacity_blocks, "used_blocks": s.used_blocks,
            "free_blocks": s.free_blocks, "used_bytes": s.used_bytes, "free_bytes": s.free_bytes,
            "segment_name": s.segment_name,
            "leases": [{"client_id": x.client_id,
                        "used_blocks": x.used_blocks, "num_jobs": x.num_jobs,
                        "expires_in_s": x.expires_in_s} for x in s.leases],
        }

    def close(self) -> None:
        """Release the lease (freeing its blocks), stop renewing it, and disconnect."""
        if self._closed.is_set():
            return
        self._closed.set()
        self._keepalive.join()
        try:
            self._stub.Release(pb.ReleaseRequest(lease_id=self._lease.lease_id),
                               timeout=min(self.timeout_s, 2.0))
        except grpc.RpcError as e:  # the store is gone or forgot us: nothing left to free
            log.debug("release of lease %d failed: %s", self._lease.lease_id, e.details())
        self._channel.close()
        if self._copier is not None:
            self._copier.shutdown()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- lease ---------------------------------------------------------------------------

    def _register(self, wait: bool) -> _Lease:
        try:
            r = self._stub.Register(pb.RegisterRequest(client_id=self.client_id,
                                                       block_bytes=self._requested_block_bytes),
                                    timeout=self.timeout_s, wait_for_ready=wait)
        except grpc.RpcError as e:
            raise self._error(e) from None
        _check_grant(r, self._requested_block_bytes)
        slots = None
        if self.prefer_shm:
            try:
                mm = shm.attach(r.segment_name, r.segment_bytes)
            except OSError as e:
                log.warning("cannot map the store's pool %r (%s); using gRPC streams",
                         r.segment_name, e)
            else:
                slots = np.frombuffer(mm, np.uint8).reshape(r.capacity_blocks, r.block_bytes)
        return _Lease(r.lease_id, r.lease_ttl_s, r.block_bytes, r.capacity_blocks,
                      (1 << r.slot_bits) - 1, r.max_chunk_bytes, slots)

    def _reregister(self, stale: _Lease) -> _Lease:
        """Replace the lease ``stale`` (unless another thread already did)."""
        with self._lock:
            if self._lease is not stale:
                return self._lease
            # Fail fast rather than wait for a store that is down: the lock is held.
            new = self._register(wait=False)
            self._lease = new
            self._jobs.clear()
            self._job_of.clear()
        log.warning("kvstore lease %d is gone (store restarted or lease expired); registered "
                    "again as lease %d (%s)", stale.lease_id, new.lease_id,
                    "shared memory" if new.slots is not None else "gRPC streams")
        return new

    def _keep_alive(self) -> None:
        while not self._closed.wait(self._lease.ttl_s / 3):
            lease = self._lease
            try:
                self._stub.KeepAlive(pb.KeepAliveRequest(lease_id=lease.lease_id),
                                     timeout=min(self.timeout_s, lease.ttl_s / 3))
            except grpc.RpcError as e:
                if not _lease_unknown(e):
                    log.debug("keepalive of lease %d failed: %s", lease.lease_id, e.details())
                    continue  # unreachable: try again next time
                try:
                    self._reregister(lease)
                except KVStoreError as e2:
                    log.debug("registering again failed: %s", e2)

    # -- helpers -------------------------------------------------------------------------

    def _call(self, lease: _Lease, method: Callable[..., Any], request: Any) -> Any:
        with self._rpc_errors(lease):
            return method(request, timeout=self.timeout_s)

    @contextmanager
    def _rpc_errors(self, lease: _Lease) -> Iterator[None]:
        """Turn a failed RPC made under ``lease`` into its KVStoreError."""
        try:
            yield
        except grpc.RpcError as e:
            raise self._error(e, lease) from None

    def _error(self, e: grpc.RpcError, lease: _Lease | None = None) -> KVStoreError:
        """The KVStoreError for a failed call; registers again when the lease is gone."""
        code, details = e.code(), e.details()
        if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
            return StoreUnavailable(code, f"kvstore at {self.address}: {details}")
        if lease is not None and _lease_unknown(e):
            new = self._reregister(lease)
            return _LeaseLost(code, f"{details}; registered again as lease {new.lease_id}, "
                                    "the old lease's handles are gone")
        kind = {grpc.StatusCode.RESOURCE_EXHAUSTED: StoreFull,
                grpc.StatusCode.DATA_LOSS: ChecksumMismatch}.get(code, KVStoreError)
        return kind(code, details)

    def _allocate(self, job_key: int, n: int) -> list[int]:
        lease = self._lease
        r = self._call(lease, self._stub.Allocate,
                       pb.AllocateRequest(lease_id=lease.lease_id, job_key=job_key, n=n))
        slots = [h & lease.slot_mask for h in r.handles]
        if len(r.handles) != n or len(set(slots)) != n or max(slots) >= lease.capacity_blocks:
            raise KVStoreError(grpc.StatusCode.INTERNAL,
                               f"the store's Allocate answered {len(r.handles)} handles for "
                               f"n={n}, or handles outside its {lease.capacity_blocks} slots "
                               "or sharing one: not used")
        with self._lock:
            if self._lease is not lease:  # another thread registered again meanwhile
                raise _LeaseLost(grpc.StatusCode.NOT_FOUND,
                                 f"lease {lease.lease_id} ended during allocate")
            self._jobs.setdefault(job_key, set()).update(r.handles)
            self._job_of.update(dict.fromkeys(r.handles, job_key))
        return list(r.handles)

    def _seal(self, lease: _Lease, handles: Sequence[int], sums: list[int]) -> None:
        self._call(lease, self._stub.Seal,
                   pb.SealRequest(lease_id=lease.lease_id, handles=handles, checksums=sums))

    @contextmanager
    def _pinned(self, handles: Sequence[int], owned: bool = True) -> Iterator[_Lease]:
        """Mark ``handles`` as being copied (``free`` waits); yields the lease to copy under.

        With ``owned``, every handle must be held by this client: a slot it does not own may
        be another lease's, and the copy goes straight into shared memory.
        """
        with self._lock:
            lease = self._lease
            if owned:
                for h in handles:
                    if h not in self._job_of:
                        raise KVStoreError(grpc.StatusCode.NOT_FOUND,
                                           f"handle {h} is not held by this client (never "
                                           "allocated, freed, or its lease ended when the store "
                                           "restarted or the lease expired)")
            for h in handles:
                self._busy[h] = self._busy.get(h, 0) + 1
        try:
            yield lease
        finally:
            with self._lock:
                for h in handles:
                    self._busy[h] -= 1
                    if not self._busy[h]:
                        del self._busy[h]
                self._idle.notify_all()

    def _forget(self, handle: int, job_key: int) -> None:
        held = self._jobs[job_key]
        held.discard(handle)
        if not held:
            del self._jobs[job_key]

    def _restore(self, lease: _Lease, jobs: dict[int, int]) -> None:
        with self._lock:
            if self._lease is lease:
                for h, job in jobs.items():
                    self._job_of[h] = job
                    self._jobs.setdefault(job, set()).add(h)

    def _stream_timeout(self, num_bytes: int) -> float:
        return self.timeout_s + num_bytes / _MIN_STREAM_BYTES_PER_S


def _lease_unknown(e: grpc.RpcError) -> bool:
    if e.code() != grpc.StatusCode.NOT_FOUND:
        return False
    return any(k == ERROR_KEY and v == LEASE_UNKNOWN for k, v in e.trailing_metadata() or ())
