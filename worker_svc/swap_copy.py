"""How KV blocks move between the device pool and the node's KV store: the data path.

A stored block is one device block across all served layers, keys and values, as raw bytes:
``pool.data[:, :, b]``, i.e. ``[layers, 2, block_size, kv_heads, head_dim]`` flattened.

Two paths, chosen by the pool's device:

| device         | swap-out                                       | swap-in                           |
|----------------|------------------------------------------------|-----------------------------------|
| host (cpu)     | copy thread: block -> store slot view (same    | copy thread: ``read()`` (verifies  |
|                | node: one copy, no staging), then ``seal()``;  | checksums) -> staging -> pool     |
|                | across nodes: -> staging -> ``write()``        |                                   |
| streams (cuda) | step thread: gather -> pinned staging on the   | copy thread: ``read()`` -> pinned  |
|                | copy stream, event; copy thread: waits for the | staging -> pool on the copy stream |
|                | event, then ``write()`` (slots or gRPC)        | (after the compute stream position |
|                |                                                | of the issue), event              |

Host copies are numpy ``copyto``: one thread's memcpy that releases the GIL, so the copy
thread overlaps with the forward pass. Not torch ``copy_``, whose OpenMP parallelism would
fight the forward pass's own threads for the cores (see kvstore_svc/client.py).
"""

from __future__ import annotations

import math
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from worker_svc.kv_pool import KVPool

# Blocks gathered per device-side copy on the streams path: bounds the temporary device memory
# a swap-out needs (a gather of a whole long job could not fit next to a full pool).
GATHER_BLOCKS = 32


@dataclass(eq=False)
class Transfer:
    """One job's copy to (``out``) or from (``in``) the store."""

    direction: str  # "out" or "in"
    job_id: int
    block_ids: list[int]  # device blocks read (out) or written (in), in block-table order
    handles: list[int]  # store slots, same order
    nbytes: int
    # out: the device blocks have been read and may be written again.
    blocks_read: threading.Event = field(default_factory=threading.Event)
    done: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None
    finished_at: float = math.inf  # time.perf_counter() when done
    copy_time_s: float = 0.0
    follows: Transfer | None = None  # in: the swap-out that filled ``handles``
    # Streams path only.
    staging: torch.Tensor | None = None
    device_event: Any = None  # out: blocks read on the copy stream; in: blocks written
    issue_event: Any = None  # in: the compute stream's position when the swap-in was issued


class HostCopier:
    """Copies on the copy thread with numpy: for a pool in host memory (CPU)."""

    def __init__(self, pool: KVPool):
        self.pool = pool
        c = pool.config
        esz = torch.empty((), dtype=pool.dtype).element_size()
        self.block_bytes = c.bytes_per_block(pool.dtype)
        # One stored block as bytes, in pool order: [layers, 2, block_size, kv_heads, head_dim].
        self.block_shape = (c.num_layers, 2, c.block_size, c.num_kv_heads, c.head_dim * esz)

    def _pool_bytes(self) -> np.ndarray:
        """The pool as bytes: ``[layers, 2, num_blocks, block_size, kv_heads, head_dim*esz]``."""
        return self.pool.data.view(torch.uint8).numpy()

    def start_out(self, t: Transfer) -> None:
        """Step thread, at SwapOut: nothing to enqueue; the copy thread reads the blocks."""

    def run_out(self, t: Transfer, client: Any) -> None:
        """Copy thread: the blocks into the store, sealed (checksummed)."""
        src = self._pool_bytes()
        if client.same_node:
            for view, b in zip(client.views(t.handles), t.block_ids):
                np.copyto(view.numpy().reshape(self.block_shape), src[:, :, b])
            t.blocks_read.set()
            client.seal(t.handles)
        else:
            staging = np.empty((len(t.handles), self.block_bytes), dtype=np.uint8)
            for row, b in zip(staging, t.block_ids):
                np.copyto(row.reshape(self.block_shape), src[:, :, b])
            t.blocks_read.set()
            client.write(t.handles, torch.from_numpy(staging))

    def start_in(self, t: Transfer) -> None:
        """Step thread, at SwapIn: nothing to enqueue."""

    def run_in(self, t: Transfer, client: Any) -> None:
        """Copy thread: read (checksums verified by the client) and scatter into the pool."""
        staging = torch.empty((len(t.handles), self.block_bytes), dtype=torch.uint8)
        client.read(t.handles, staging)
        dst = self._pool_bytes()
        for row, b in zip(staging.numpy(), t.block_ids):
            np.copyto(dst[:, :, b], row.reshape(self.block_shape))

    def make_writable(self, t: Transfer) -> bool:
        """Step thread: block until the swap-out ``t`` no longer reads its device blocks.

        Returns True when the host had to wait (False when they were already read).
        """
        if t.blocks_read.is_set():
            return False
        t.blocks_read.wait()
        return True

    def before_compute(self, t: Transfer) -> None:
        """Step thread: order the compute after the finished swap-in ``t``; nothing on a host."""


class StreamCopier(HostCopier):
    """Copies through pinned staging on a dedicated copy stream (CUDA, or any device whose
    torch module has streams and events), with events ordering them against the compute
    stream: the host never waits for a device copy it does not need."""

    def __init__(self, pool: KVPool, device_module: Any = None):
        super().__init__(pool)
        self.device = pool.device
        # torch.cuda for a CUDA pool: Stream, Event, current_stream, stream.
        self.mod = device_module or torch.get_device_module(self.device)
        self.copy_stream = self.mod.Stream(device=self.device)
        self.pin_memory = self.device.type != "cpu"

    def _compute_stream(self) -> Any:
        return self.mod.current_stream(self.device)

    def _staging(self, n: int) -> torch.Tensor:
        # Torch's caching host allocator recycles pinned buffers; every use of one is finished
        # (its event synchronized) before the tensor is dropped.
        return torch.empty((n, self.block_bytes), dtype=torch.uint8, pin_memory=self.pin_memory)

    def start_out(self, t: Transfer) -> None:
        n = len(t.block_ids)
        t.staging = staging = self._staging(n)
        rows = staging.view(n, *self.block_shape)
        # The blocks' last writes were made by earlier forward passes on the compute stream.
        self.copy_stream.wait_stream(self._compute_stream())
        with self.mod.stream(self.copy_stream):
            src = self.pool.data.view(torch.uint8)
            for lo in range(0, n, GATHER_BLOCKS):
                ids = torch.tensor(t.block_ids[lo:lo + GATHER_BLOCKS], device=self.device)
                part = src.index_select(2, ids).movedim(2, 0).contiguous()
                rows[lo:lo + len(ids)].copy_(part, non_blocking=True)
            t.device_event = self.mod.Event()
            t.device_event.record(self.copy_stream)

    def run_out(self, t: Transfer, client: Any) -> None:
        assert t.staging is not None and t.device_event is not None
        t.device_event.synchronize()
        t.blocks_read.set()
        staging, t.staging = t.staging, None
        client.write(t.handles, staging)  # into the slots (same node) or over gRPC; sealed

    def start_in(self, t: Transfer) -> None:
        t.issue_event = self.mod.Event()
        t.issue_event.record(self._compute_stream())

    def run_in(self, t: Transfer, client: Any) -> None:
        n = len(t.handles)
        staging = self._staging(n)
        client.read(t.handles, staging)
        with self.mod.stream(self.copy_stream):
            # Earlier users of these blocks (forward passes, swap-outs) are done with them: the
            # compute stream reached issue_event, and swap-outs run on this same stream.
            self.copy_stream.wait_event(t.issue_event)
            idx = torch.tensor(t.block_ids, device=self.device)
            rows = staging.to(self.device, non_blocking=True).view(n, *self.block_shape)
            self.pool.data.view(torch.uint8).index_copy_(2, idx, rows.movedim(0, 2))
            t.device_event = self.mod.Event()
            t.device_event.record(self.copy_stream)
        t.device_event.synchronize()  # staging may be recycled only after the upload read it

    def make_writable(self, t: Transfer) -> bool:
        # Waits on the device, not the host: the compute stream resumes once the read is done.
        self._compute_stream().wait_event(t.device_event)
        return False

    def before_compute(self, t: Transfer) -> None:
        if t.device_event is not None:
            self._compute_stream().wait_event(t.device_event)


class CopyThread:
    """One daemon thread running queued callables in order; started on first use."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None

    def submit(self, fn: Callable[[], None]) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="kv-copy", daemon=True)
            self._thread.start()
        self._queue.put(fn)

    def _loop(self) -> None:
        while (fn := self._queue.get()) is not None:
            fn()

    def drain(self, timeout_s: float) -> bool:
        """Wait until everything submitted so far has run; True if it did in time."""
        if self._thread is None:
            return True
        ran = threading.Event()
        self.submit(ran.set)
        return ran.wait(timeout_s)

    def stop(self) -> None:
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None


def make_copier(pool: KVPool) -> HostCopier:
    """The data path for the pool's device: streams where the device has them, else host."""
    if pool.device.type == "cpu":
        return HostCopier(pool)
    return StreamCopier(pool)
