"""The worker's swap engine: jobs' KV between the device pool and the node's KV store.

The scheduler decides what moves and when; this module makes each move asynchronous and safe.
Copies run in order on one copy thread (and, on devices with streams, one copy stream), so that
a swap-in always runs after every swap-out issued before it. The step thread does only what must
be known at once: allocating store space (a full store refuses the SwapOut in its own Step),
issuing device-side copies, and waiting where correctness needs it:

| the step thread ...                             | waits for                                     |
|-------------------------------------------------|-----------------------------------------------|
| claims a block for compute (NewJob, append)     | the swap-out reading that block (CUDA: on the  |
|                                                 | device, via an event; the host goes on)       |
| claims a block as a SwapIn target               | nothing: that swap-in is queued after the read |
| commands (or swaps out) an uploading job        | the job's swap-in                             |
| frees a job with a copy in flight               | that copy, then frees its store space         |

A job's residency is DEVICE (not tracked here), OFFLOADED (its KV is in the store, or on its
way there) or UPLOADING (its swap-in has been issued; its first command consumes it).
"""

from __future__ import annotations

import collections
import enum
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from fastserve.tls import Tls
from kvstore_svc.client import KVStoreError, StoreFull
from worker_svc.errors import ErrorCode, JobRejected, KVLost
from worker_svc.kv_pool import KVPool
from worker_svc.store_link import StoreLink, failure_reason
from worker_svc.swap_copy import CopyThread, HostCopier, Transfer, make_copier

log = logging.getLogger(__name__)

# How often, at most, the store's free block count is read again (for SwapStats and metrics).
STATS_INTERVAL_S = 1.0


class Residency(enum.Enum):
    DEVICE = "device"
    OFFLOADED = "offloaded"
    UPLOADING = "uploading"


@dataclass
class SwapStats:
    """Copies completed since the previous Step's stats (see the SwapStats proto)."""

    num_blocks_out: int = 0
    num_bytes_out: int = 0
    num_blocks_in: int = 0
    num_bytes_in: int = 0
    copy_time_s: float = 0.0
    num_swap_ins_hidden: int = 0
    num_swap_ins_waited: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # "out:store_full" -> count
    store_free_blocks: int | None = None
    num_offloaded_jobs: int = 0
    num_copies_in_flight: int = 0


@dataclass
class StoreInfo:
    """The store as Describe reports it."""

    address: str
    connected: bool
    capacity_blocks: int = 0
    same_node: bool = False
    block_bytes: int = 0


@dataclass
class _StoreJob:
    """A job whose KV is in the store (or moving)."""

    out: Transfer  # the swap-out that filled ``out.handles``
    upload: Transfer | None = None  # the issued swap-in, until a command consumes it


class SwapEngine:
    """Offloads and uploads whole jobs' KV; driven by the Engine, one Step at a time.

    Everything but the copy thread's work runs in the step thread, under the caller's engine
    lock; state shared with the copy thread is the transfers' events and ``_done``.
    """

    def __init__(self, pool: KVPool, kvstore: str | None = None, *, client_id: str = "worker",
                 prefer_shm: bool = True, copier: HostCopier | None = None,
                 tls: Tls | None = None):
        self.pool = pool
        self._copier = copier
        self.block_bytes = pool.config.bytes_per_block(pool.dtype)
        self.store = StoreLink(kvstore, client_id, self.block_bytes, prefer_shm, tls=tls)
        self.store.connect()
        self._jobs: dict[int, _StoreJob] = {}
        self._reading: dict[int, Transfer] = {}  # device block -> swap-out still reading it
        self._in_flight: set[Transfer] = set()
        self._done: collections.deque[Transfer] = collections.deque()  # from the copy thread
        self._failures: collections.Counter[str] = collections.Counter()
        self._store_free: int | None = None
        self._store_dirty = False
        self._next_stats = 0.0
        self._copy = CopyThread()
        self._step_start = 0.0
        self._wait_s = 0.0
        self._hidden = 0
        self._waited = 0

    # ---- state the Engine asks about

    @property
    def configured(self) -> bool:
        return self.store.address is not None

    @property
    def num_offloaded_jobs(self) -> int:
        """Jobs whose KV is in the store (offloaded or uploading); atomic, for scrapes."""
        return len(self._jobs)

    @property
    def store_free_blocks(self) -> int | None:
        """Free blocks in the store as last read from it, or None."""
        return self._store_free

    def residency(self, job_id: int) -> Residency:
        sj = self._jobs.get(job_id)
        if sj is None:
            return Residency.DEVICE
        return Residency.OFFLOADED if sj.upload is None else Residency.UPLOADING

    def store_handles(self, job_id: int) -> list[int]:
        """The store handles holding an offloaded job's KV, in block-table order."""
        sj = self._jobs.get(job_id)
        return list(sj.out.handles) if sj is not None else []

    @property
    def copier(self) -> HostCopier:
        # Built on first use, so a worker on a device without a data path still serves.
        if self._copier is None:
            self._copier = make_copier(self.pool)
        return self._copier

    def info(self) -> StoreInfo:
        """For Describe; starts a connection attempt when not connected."""
        self.store.connect()
        client = self.store.client
        if client is None:
            return StoreInfo(self.store.address or "", False)
        return StoreInfo(self.store.address or "", True, client.capacity_blocks,
                         client.same_node, client.block_bytes)

    # ---- one Step

    def begin_step(self) -> None:
        self._step_start = time.perf_counter()
        self._wait_s = 0.0
        self._hidden = self._waited = 0

    def end_step(self) -> tuple[float, SwapStats]:
        """Seconds this Step waited, and the copies completed since the previous call."""
        stats = SwapStats(num_swap_ins_hidden=self._hidden, num_swap_ins_waited=self._waited)
        while self._done:
            t = self._done.popleft()
            self._in_flight.discard(t)
            stats.copy_time_s += t.copy_time_s
            if t.error is not None:
                self._failures[f"{t.direction}:{failure_reason(t.error)}"] += 1
            elif t.direction == "out":
                stats.num_blocks_out += len(t.handles)
                stats.num_bytes_out += t.nbytes
            else:
                stats.num_blocks_in += len(t.handles)
                stats.num_bytes_in += t.nbytes
        for b in [b for b, t in self._reading.items() if t.blocks_read.is_set()]:
            del self._reading[b]
        stats.failures = dict(self._failures)
        self._failures.clear()
        now = time.monotonic()
        if self._store_dirty and self.store.client is not None and now >= self._next_stats:
            # Queued behind the copies (never ahead of them), and rarely: it is informational.
            self._store_dirty = False
            self._next_stats = now + STATS_INTERVAL_S
            self._copy.submit(self._refresh_store_stats)
        stats.store_free_blocks = self._store_free
        stats.num_offloaded_jobs = len(self._jobs)
        stats.num_copies_in_flight = len(self._in_flight)
        return self._wait_s, stats

    def _wait(self, event: threading.Event) -> None:
        """Block until ``event`` is set, counting the time in this Step's swap wait."""
        if not event.is_set():
            start = time.perf_counter()
            event.wait()
            self._wait_s += time.perf_counter() - start

    # ---- the Step's parts

    def offload(self, job_id: int, block_ids: list[int]) -> None:
        """Start copying ``block_ids`` (the job's KV, in order) to the store.

        Raises JobRejected (job unchanged) when the store cannot take them. On return the
        caller releases the job's blocks: writes into them wait for this copy's read.
        """
        assert job_id not in self._jobs
        try:
            client = self.store.get()
        except JobRejected:
            self._failures["out:no_store" if not self.configured else "out:store_unavailable"] += 1
            raise
        n = len(block_ids)
        if n > client.capacity_blocks:
            self._failures["out:store_full"] += 1
            raise JobRejected(ErrorCode.RESOURCE_EXHAUSTED,
                              f"swap_out: job {job_id} has {n} KV blocks; the kvstore holds at "
                              f"most {client.capacity_blocks}")
        try:
            handles = client.allocate(job_id, n) if n else []
        except Exception as e:  # noqa: BLE001 - a store problem fails only this job
            self._failures[f"out:{failure_reason(e)}"] += 1
            self._store_dirty = True
            if isinstance(e, StoreFull):
                raise JobRejected(ErrorCode.RESOURCE_EXHAUSTED,
                                  f"swap_out: the kvstore cannot take job {job_id}'s {n} "
                                  f"blocks: {e}") from None
            code = ErrorCode.UNAVAILABLE if isinstance(e, KVStoreError) else ErrorCode.INTERNAL
            raise JobRejected(code, f"swap_out: kvstore {self.store.address}: "
                                    f"{type(e).__name__}: {e}") from None
        self._store_dirty = True
        t = Transfer("out", job_id, list(block_ids), handles, n * self.block_bytes)
        if n == 0:
            self._finish(t, time.perf_counter())
        else:
            try:
                self.copier.start_out(t)
            except Exception as e:  # noqa: BLE001 - e.g. device out of memory: this job only
                self._free_store(job_id)
                raise JobRejected(ErrorCode.INTERNAL,
                                  f"swap_out: copy failed: {type(e).__name__}: {e}") from None
            for b in block_ids:
                self._reading[b] = t
            self._submit(t, self.copier.run_out, client)
        self._jobs[job_id] = _StoreJob(t)

    def upload(self, job_id: int, block_ids: list[int]) -> None:
        """Start copying an offloaded job's KV into ``block_ids`` (free, checked blocks).

        Raises KVLost when its offload is already known to have failed.
        """
        sj = self._jobs[job_id]
        assert sj.upload is None and len(block_ids) == len(sj.out.handles)
        if sj.out.done.is_set() and sj.out.error is not None:
            raise KVLost(f"swap_in: job {job_id}'s KV never reached the store: {sj.out.error}")
        client = self.store.client
        assert client is not None  # an offloaded job implies a connected client
        t = Transfer("in", job_id, list(block_ids), sj.out.handles, sj.out.nbytes, follows=sj.out)
        sj.upload = t
        if not block_ids:
            self._finish(t, time.perf_counter())
            return
        self.copier.start_in(t)
        self._submit(t, self.copier.run_in, client)

    def finish_upload(self, job_id: int) -> None:
        """Wait for the job's swap-in; afterwards the job is on the device.

        Raises KVLost when the copy failed (the caller drops the job; ``forget`` frees the
        store). Counts the swap-in as hidden when it finished before this Step began.
        """
        sj = self._jobs[job_id]
        t = sj.upload
        assert t is not None
        if t.finished_at <= self._step_start:
            self._hidden += 1
        else:
            self._waited += 1
            self._wait(t.done)
        if t.error is not None:
            raise KVLost(f"swap_in of job {job_id} failed, its KV is lost: "
                         f"{type(t.error).__name__}: {t.error}")
        self.copier.before_compute(t)
        del self._jobs[job_id]  # the copy thread freed its store slots after reading them

    def make_writable(self, block_ids: list[int]) -> None:
        """Before compute writes into ``block_ids``: wait for swap-outs still reading them."""
        for t in {self._reading.pop(b) for b in block_ids if b in self._reading}:
            start = time.perf_counter()
            if self.copier.make_writable(t):
                self._wait_s += time.perf_counter() - start

    def forget(self, job_id: int) -> None:
        """The job is freed: wait for its copies in flight, then free its store space."""
        sj = self._jobs.pop(job_id, None)
        if sj is None:
            return
        for t in (sj.out, sj.upload):
            if t is not None:
                self._wait(t.done)
        if sj.upload is None or sj.upload.error is not None:
            self._free_store(job_id)

    def close(self) -> None:
        self._copy.stop()
        self.store.close()

    def wait_idle(self, timeout_s: float = 30.0) -> bool:
        """Wait until the copy thread has finished everything issued so far (copies and the
        store frees that follow swap-ins); for tests and tools. True if it did in time."""
        return self._copy.drain(timeout_s)

    # ---- copy thread

    def _submit(self, t: Transfer, run: Callable[[Transfer, Any], None], client: Any) -> None:
        self._in_flight.add(t)

        def task() -> None:
            start = time.perf_counter()
            try:
                if t.follows is not None and t.follows.error is not None:
                    raise t.follows.error
                run(t, client)
            except Exception as e:  # noqa: BLE001 - reported per job, never kills the thread
                t.error = e
            finally:
                t.copy_time_s = time.perf_counter() - start
                self._finish(t, time.perf_counter())
            if t.direction == "in" and t.error is None:
                # After done: a Step waiting for this upload does not wait for the Free RPC.
                self._free_handles(client, t.handles)

        self._copy.submit(task)

    def _finish(self, t: Transfer, now: float) -> None:
        t.finished_at = now
        t.blocks_read.set()
        t.done.set()
        self._done.append(t)
        self._store_dirty = True

    def _free_handles(self, client: Any, handles: list[int]) -> None:
        try:
            client.free(handles)
        except KVStoreError as e:  # the data is in the pool already; a dead store lost them too
            log.warning("kvstore free after swap-in failed: %s", e)

    def _free_store(self, job_id: int) -> None:
        client = self.store.client
        if client is None:
            return
        try:
            client.free_job(job_id)
        except KVStoreError as e:
            log.warning("kvstore free_job(%d) failed: %s", job_id, e)
        self._store_dirty = True

    def _refresh_store_stats(self) -> None:
        client = self.store.client
        if client is None:
            return
        try:
            stats = client.stats()
        except Exception as e:  # noqa: BLE001 - informational only
            log.debug("kvstore stats failed: %s", e)
            self._store_free = None
            return
        self._store_free = stats.get("free_blocks")
