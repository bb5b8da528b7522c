"""The store's state: fixed-size blocks in one memory segment, leases, handles and checksums.

Pure Python (no gRPC, torch or Prometheus), so the allocation rules are unit-tested directly;
``server.py`` turns a ``PoolError`` into the gRPC status of the same name. Every method takes
the pool's lock, so the gRPC threads may call it concurrently. The pool never evicts: when it
is full, ``allocate`` refuses and nothing held changes.

A slot is in exactly one of two states, which ``check_invariants`` verifies:

| slot      | in ``_free`` | in ``_blocks`` (by handle)                           |
|-----------|--------------|------------------------------------------------------|
| free      | yes          | no                                                   |
| allocated | no           | under one handle, held by one live lease, in one job |

A handle is ``generation << slot_bits | slot``. Every ``allocate`` call takes the next
generation, so a handle is never reissued while the store runs: a stale handle (freed, or of
an expired lease) never names a slot's next tenant. The first generation is random, so
handles of a previous run of the store are, with overwhelming probability, unknown to this
one as well.
"""

from __future__ import annotations

import enum
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

MAX_CLIENT_ID_CHARS = 128
_HANDLE_BITS = 64


class ErrorCode(enum.IntEnum):
    """Why a call was refused; the values match gRPC status codes."""

    INVALID_ARGUMENT = 3
    NOT_FOUND = 5
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    FAILED_PRECONDITION = 9
    DATA_LOSS = 15


class PoolError(Exception):
    """A refused call: ``code`` and a message naming the field and the limit.

    ``lease_unknown`` marks the one NOT_FOUND a client answers by registering again.
    """

    def __init__(self, code: ErrorCode, message: str, *, lease_unknown: bool = False):
        super().__init__(message)
        self.code = code
        self.message = message
        self.lease_unknown = lease_unknown


class Segment(Protocol):
    """The memory the slots live in: ``buf`` is writable and at least the requested size."""

    @property
    def name(self) -> str: ...

    @property
    def buf(self) -> memoryview: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class Grant:
    """What ``register`` gives a new lease: its id and how to reach the slots."""

    lease_id: int
    lease_ttl_s: float
    segment_name: str
    segment_bytes: int
    block_bytes: int
    capacity_blocks: int
    slot_bits: int


@dataclass(frozen=True)
class LeaseStats:
    lease_id: int
    client_id: str
    used_blocks: int
    num_jobs: int
    expires_in_s: float


@dataclass(frozen=True)
class PoolStats:
    """A snapshot of usage. Before the segment exists, block_bytes and every count are 0."""

    budget_bytes: int
    block_bytes: int
    capacity_blocks: int
    used_blocks: int
    free_blocks: int
    segment_name: str
    leases: list[LeaseStats]

    @property
    def used_bytes(self) -> int:
        return self.used_blocks * self.block_bytes

    @property
    def free_bytes(self) -> int:
        return self.free_blocks * self.block_bytes


@dataclass
class _Block:
    slot: int
    lease_id: int
    job_key: int
    checksum: int | None = None  # None: never written, or being rewritten; not readable


@dataclass
class _Lease:
    lease_id: int
    client_id: str
    expires_at: float
    holder: str  # who registered it (``register``'s ``holder``); "" on plaintext
    jobs: dict[int, set[int]] = field(default_factory=dict)  # job_key -> handles
    num_blocks: int = 0


class BlockPool:
    """Blocks of ``block_bytes`` in a segment of ``budget_bytes // block_bytes`` slots.

    ``block_bytes`` is fixed here or by the first ``register``; the segment is created by
    ``new_segment(size)`` at that moment, so a store started without it costs no memory until
    a worker says how big its blocks are. ``clock`` (seconds) times leases.
    """

    def __init__(
        self,
        budget_bytes: int,
        new_segment: Callable[[int], Segment],
        *,
        block_bytes: int | None = None,
        lease_ttl_s: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ):
        if budget_bytes < 1:
            raise ValueError(f"budget_bytes must be at least 1, got {budget_bytes}")
        if block_bytes is not None and not 1 <= block_bytes <= budget_bytes:
            raise ValueError(
                f"block_bytes must be in [1, budget_bytes={budget_bytes}], got {block_bytes}"
            )
        if not lease_ttl_s > 0:
            raise ValueError(f"lease_ttl_s must be positive, got {lease_ttl_s}")
        self.budget_bytes = budget_bytes
        self.lease_ttl_s = lease_ttl_s
        self._new_segment = new_segment
        self._clock = clock
        self._lock = threading.Lock()
        self._leases: dict[int, _Lease] = {}
        self._blocks: dict[int, _Block] = {}
        self._free: list[int] = []  # a stack; popped from the end
        self._segment: Segment | None = None
        self._buf: memoryview | None = None
        self.block_bytes = 0
        self.capacity_blocks = 0
        self.slot_bits = 0
        self._generation = 0
        if block_bytes is not None:
            self._create_segment(block_bytes)

    # -- leases --------------------------------------------------------------------------

    def register(self, client_id: str, block_bytes: int, holder: str = "") -> Grant:
        """Start a lease for ``client_id``; fixes block_bytes (and creates the segment) first.

        ``holder`` names the caller as the transport proved it (its certificate): only calls
        with the same ``holder`` may use the lease (``check_holder``)."""
        if not 1 <= len(client_id) <= MAX_CLIENT_ID_CHARS:
            raise PoolError(ErrorCode.INVALID_ARGUMENT,
                            f"client_id: must be 1 to {MAX_CLIENT_ID_CHARS} characters, "
                            f"got {len(client_id)}")
        with self._lock:
            if self._segment is None:
                if not 1 <= block_bytes <= self.budget_bytes:
                    raise PoolError(ErrorCode.INVALID_ARGUMENT,
                                    f"block_bytes: must be in [1, budget_bytes="
                                    f"{self.budget_bytes}], got {block_bytes}")
                try:
                    self._create_segment(block_bytes)
                except OSError as e:
                    raise PoolError(ErrorCode.FAILED_PRECONDITION,
                                    f"cannot create the {self.budget_bytes}-byte pool: {e}") from e
            elif block_bytes != self.block_bytes:
                raise PoolError(ErrorCode.FAILED_PRECONDITION,
                                f"block_bytes: this store's blocks are {self.block_bytes} bytes, "
                                f"the client asked for {block_bytes}; every client of a store "
                                "must use the same block size")
            lease_id = 0
            while lease_id == 0 or lease_id in self._leases:
                lease_id = secrets.randbits(63)
            self._leases[lease_id] = _Lease(lease_id, client_id,
                                            self._clock() + self.lease_ttl_s, holder)
            assert self._segment is not None
            return Grant(lease_id, self.lease_ttl_s, self._segment.name,
                         self.capacity_blocks * self.block_bytes, self.block_bytes,
                         self.capacity_blocks, self.slot_bits)

    def check_holder(self, lease_id: int, holder: str) -> None:
        """Refuse (PERMISSION_DENIED) a caller other than the one that registered the lease;
        an unknown lease is NOT_FOUND as everywhere."""
        with self._lock:
            if self._lease(lease_id).holder != holder:
                raise PoolError(ErrorCode.PERMISSION_DENIED,
                                "lease_id: this lease belongs to another client; a lease's "
                                "blocks are served only to the certificate that registered it")

    def keep_alive(self, lease_id: int) -> float:
        """Renew a lease; returns its TTL in seconds."""
        with self._lock:
            self._lease(lease_id).expires_at = self._clock() + self.lease_ttl_s
            return self.lease_ttl_s

    def release(self, lease_id: int) -> int:
        """End a lease; returns the number of blocks it freed."""
        with self._lock:
            return self._drop_lease(self._lease(lease_id))

    def reap_expired(self) -> list[tuple[LeaseStats, int]]:
        """End every expired lease; returns each one's last stats and the blocks it freed."""
        with self._lock:
            now = self._clock()
            expired = [lease for lease in self._leases.values() if lease.expires_at <= now]
            return [(self._lease_stats(lease, now), self._drop_lease(lease)) for lease in expired]

    # -- blocks --------------------------------------------------------------------------

    def allocate(self, lease_id: int, job_key: int, n: int) -> list[int]:
        """``n`` new handles for ``job_key``, all or nothing; the blocks are unsealed."""
        with self._lock:
            lease = self._lease(lease_id)
            if not 1 <= n <= self.capacity_blocks:
                raise PoolError(ErrorCode.INVALID_ARGUMENT,
                                f"n: must be in [1, capacity_blocks={self.capacity_blocks}], "
                                f"got {n}")
            if n > len(self._free):
                raise PoolError(ErrorCode.RESOURCE_EXHAUSTED,
                                f"requested {n} blocks, {len(self._free)} free of "
                                f"{self.capacity_blocks} ({self.block_bytes} bytes each, budget "
                                f"{self.budget_bytes} bytes)")
            self._generation = self._generation % ((1 << (_HANDLE_BITS - self.slot_bits)) - 1) + 1
            slots = self._free[-n:]
            del self._free[-n:]
            slots.reverse()  # a fresh pool hands out ascending runs: contiguous copies
            handles = [self._generation << self.slot_bits | s for s in slots]
            for h, s in zip(handles, slots):
                self._blocks[h] = _Block(s, lease_id, job_key)
            lease.jobs.setdefault(job_key, set()).update(handles)
            lease.num_blocks += n
            return handles

    def free(self, lease_id: int, handles: Sequence[int]) -> int:
        """Free handles of this lease, all or nothing; returns how many."""
        with self._lock:
            lease = self._lease(lease_id)
            blocks = self._owned(lease, handles)
            for h, b in zip(handles, blocks):
                self._free_block(lease, h, b)
            return len(blocks)

    def free_job(self, lease_id: int, job_key: int) -> list[int]:
        """Free every handle of ``job_key`` in this lease; returns them (maybe none)."""
        with self._lock:
            lease = self._lease(lease_id)
            handles = sorted(lease.jobs.get(job_key, ()))
            for h in handles:
                self._free_block(lease, h, self._blocks[h])
            return handles

    def seal(self, lease_id: int, handles: Sequence[int], checksums: Sequence[int]) -> None:
        """Record the checksums of written blocks, making them readable."""
        with self._lock:
            lease = self._lease(lease_id)
            if len(checksums) != len(handles):
                raise PoolError(ErrorCode.INVALID_ARGUMENT,
                                f"checksums: {len(checksums)} given for {len(handles)} handles; "
                                "one per handle")
            for b, checksum in zip(self._owned(lease, handles), checksums):
                b.checksum = checksum

    def checksums(self, lease_id: int, handles: Sequence[int]) -> list[int]:
        """The recorded checksums of sealed blocks; FAILED_PRECONDITION for unsealed ones."""
        with self._lock:
            return [self._sealed(h, b)
                    for h, b in zip(handles, self._owned(self._lease(lease_id), handles))]

    def write(self, lease_id: int, handle: int, offset: int, data: bytes) -> None:
        """Copy ``data`` into a block at ``offset``; the block is unsealed until ``seal``."""
        with self._lock:
            (b,) = self._owned(self._lease(lease_id), [handle])
            self._check_range(handle, offset, len(data))
            b.checksum = None
            start = b.slot * self.block_bytes + offset
            assert self._buf is not None
            self._buf[start:start + len(data)] = data

    def read(self, lease_id: int, handle: int, offset: int, length: int) -> bytes:
        """A copy of ``length`` bytes of a sealed block from ``offset``."""
        with self._lock:
            (b,) = self._owned(self._lease(lease_id), [handle])
            self._check_range(handle, offset, length)
            self._sealed(handle, b)
            start = b.slot * self.block_bytes + offset
            assert self._buf is not None
            return bytes(self._buf[start:start + length])

    # -- inspection ----------------------------------------------------------------------

    def stats(self) -> PoolStats:
        with self._lock:
            now = self._clock()
            return PoolStats(
                budget_bytes=self.budget_bytes,
                block_bytes=self.block_bytes,
                capacity_blocks=self.capacity_blocks,
                used_blocks=len(self._blocks),
                free_blocks=len(self._free),
                segment_name=self._segment.name if self._segment is not None else "",
                leases=[self._lease_stats(lease, now) for lease in self._leases.values()],
            )

    def check_invariants(self) -> None:
        """Assert that every slot is free or held by exactly one handle of one live lease."""
        with self._lock:
            held = [b.slot for b in self._blocks.values()]
            assert len(held) + len(self._free) == self.capacity_blocks
            assert set(held).isdisjoint(self._free) and len(set(held)) == len(held)
            assert len(set(self._free)) == len(self._free)
            for h, b in self._blocks.items():
                assert h & ((1 << self.slot_bits) - 1) == b.slot
                assert h in self._leases[b.lease_id].jobs[b.job_key]
            for lease in self._leases.values():
                assert all(lease.jobs.values())
                assert lease.num_blocks == sum(len(hs) for hs in lease.jobs.values())

    def close(self) -> None:
        """Drop every lease and release the segment (a shared one is unlinked)."""
        with self._lock:
            self._leases.clear()
            self._blocks.clear()
            self._free.clear()
            self._buf = None
            if self._segment is not None:
                self._segment.close()
                self._segment = None

    # -- helpers (the lock is held) ------------------------------------------------------

    def _create_segment(self, block_bytes: int) -> None:
        capacity = self.budget_bytes // block_bytes
        self._segment = self._new_segment(capacity * block_bytes)
        self._buf = self._segment.buf
        self.block_bytes = block_bytes
        self.capacity_blocks = capacity
        self.slot_bits = max(1, (capacity - 1).bit_length())
        self._free = list(range(capacity - 1, -1, -1))
        # Random, so handles of an earlier run of the store are unknown to this one; within
        # the first 1/65536 of the generation space, so it does not wrap in practice.
        self._generation = secrets.randbelow(1 << max(0, _HANDLE_BITS - self.slot_bits - 16))

    def _lease(self, lease_id: int) -> _Lease:
        if lease_id == 0:
            raise PoolError(ErrorCode.INVALID_ARGUMENT,
                            "lease_id: required (got 0); Register first")
        lease = self._leases.get(lease_id)
        if lease is not None and lease.expires_at <= self._clock():
            self._drop_lease(lease)  # expired but not reaped yet: same answer as after reaping
            lease = None
        if lease is None:
            raise PoolError(ErrorCode.NOT_FOUND,
                            f"lease {lease_id} unknown (expired or store restarted); "
                            "register again", lease_unknown=True)
        return lease

    def _owned(self, lease: _Lease, handles: Sequence[int]) -> list[_Block]:
        if len(handles) > self.capacity_blocks:
            raise PoolError(ErrorCode.INVALID_ARGUMENT,
                            f"handles: {len(handles)} given, more than capacity_blocks="
                            f"{self.capacity_blocks}")
        if len(set(handles)) != len(handles):
            dup = next(h for i, h in enumerate(handles) if h in handles[:i])
            raise PoolError(ErrorCode.INVALID_ARGUMENT, f"handles: {dup} is listed twice")
        blocks = []
        for h in handles:
            b = self._blocks.get(h)
            if b is None or b.lease_id != lease.lease_id:
                raise PoolError(ErrorCode.NOT_FOUND,
                                f"handle {h} is not held by lease {lease.lease_id} (never "
                                "allocated, freed, or its lease ended)")
            blocks.append(b)
        return blocks

    def _sealed(self, handle: int, b: _Block) -> int:
        if b.checksum is None:
            raise PoolError(ErrorCode.FAILED_PRECONDITION,
                            f"handle {handle} was allocated but not written (no Write completed "
                            "and no Seal since); nothing to read")
        return b.checksum

    def _check_range(self, handle: int, offset: int, length: int) -> None:
        if length < 1 or offset + length > self.block_bytes:
            raise PoolError(ErrorCode.INVALID_ARGUMENT,
                            f"offset: {length} bytes at offset {offset} of handle {handle} "
                            f"leave the block (block_bytes={self.block_bytes})")

    def _free_block(self, lease: _Lease, handle: int, b: _Block) -> None:
        del self._blocks[handle]
        job = lease.jobs[b.job_key]
        job.discard(handle)
        if not job:
            del lease.jobs[b.job_key]
        lease.num_blocks -= 1
        self._free.append(b.slot)

    def _drop_lease(self, lease: _Lease) -> int:
        freed = lease.num_blocks
        for handles in list(lease.jobs.values()):
            for h in list(handles):
                self._free_block(lease, h, self._blocks[h])
        del self._leases[lease.lease_id]
        return freed

    def _lease_stats(self, lease: _Lease, now: float) -> LeaseStats:
        return LeaseStats(lease.lease_id, lease.client_id, lease.num_blocks, len(lease.jobs),
                          max(0.0, lease.expires_at - now))
