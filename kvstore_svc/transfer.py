"""How block bytes move between a client and the store, checksummed: both data paths.

Same node, ``copy_blocks``: numpy ``copyto`` (a single-threaded memcpy that releases the GIL)
over a small thread pool, one block at a time, hashing each block right after copying it while
it is still in cache. Not torch ``copy_``: its intra-op parallelism spins OpenMP threads that
collapse when another process holds a core (measured 0.09 GB/s instead of 9 on a loaded 2-core
machine) and would compete with the worker's own compute threads.

Across nodes, ``stream_write`` / ``stream_read``: the Write and Read streams, one block at a
time in chunks of at most the store's ``max_chunk_bytes``. The receiver verifies each block.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import grpc
import numpy as np
import torch
import xxhash

from fastserve.proto import kvstore_pb2 as pb
from fastserve.proto import kvstore_pb2_grpc
from kvstore_svc.errors import ChecksumMismatch, KVStoreError


def as_rows(t: torch.Tensor, n: int, block_bytes: int, name: str) -> np.ndarray:
    """``t`` [n, block_bytes] uint8 on the CPU as a numpy view (no copy); ValueError if not."""
    if (not isinstance(t, torch.Tensor) or t.dtype != torch.uint8 or t.device.type != "cpu"
            or tuple(t.shape) != (n, block_bytes)):
        got = (f"{t.dtype} {tuple(t.shape)} on {t.device}" if isinstance(t, torch.Tensor)
               else type(t).__name__)
        raise ValueError(f"{name}: expected a CPU uint8 tensor of shape [{n}, {block_bytes}], "
                         f"got {got}")
    return t.detach().numpy()


def copy_blocks(dst: Sequence[np.ndarray] | np.ndarray, src: Sequence[np.ndarray] | np.ndarray,
                executor: ThreadPoolExecutor | None = None, parts: int = 1, *,
                checksum: bool = True) -> list[int]:
    """Copy each ``src[i]`` into ``dst[i]`` (1-D, contiguous); returns xxh3_64 of each ``dst[i]``
    (or nothing without ``checksum``). The blocks are split into ``parts`` runs, one per
    ``executor`` thread."""

    def run(lo: int, hi: int) -> list[int]:
        sums = []
        for i in range(lo, hi):
            np.copyto(dst[i], src[i])
            if checksum:
                sums.append(xxhash.xxh3_64_intdigest(dst[i]))
        return sums

    n = len(dst)
    parts = min(n, parts)
    if executor is None or parts <= 1:
        return run(0, n)
    bounds = [n * k // parts for k in range(parts + 1)]
    return [s for part in executor.map(run, bounds[:-1], bounds[1:]) for s in part]


def stream_write(stub: kvstore_pb2_grpc.KVStoreStub, lease_id: int, handles: Sequence[int],
                 src: np.ndarray, chunk_bytes: int, timeout_s: float) -> None:
    """Write ``src`` [n, block_bytes] (contiguous rows) as the blocks of ``handles``.

    Raises grpc.RpcError as the store answered (DATA_LOSS if a block arrived corrupted).
    """

    def chunks() -> Iterator[pb.WriteChunk]:
        for h, row in zip(handles, src):
            checksum = xxhash.xxh3_64_intdigest(row)
            for off in range(0, len(row), chunk_bytes):
                yield pb.WriteChunk(lease_id=lease_id, handle=h, offset=off,
                                    data=row[off:off + chunk_bytes].tobytes(), checksum=checksum)

    stub.Write(chunks(), timeout=timeout_s)


def stream_read(stub: kvstore_pb2_grpc.KVStoreStub, lease_id: int, handles: Sequence[int],
                dst: np.ndarray, timeout_s: float) -> None:
    """Fill ``dst`` [n, block_bytes] (contiguous rows) with the blocks of ``handles``, verified.

    Raises ``ChecksumMismatch`` naming the first bad handle, and grpc.RpcError as the store
    answered.
    """
    block_bytes = dst.shape[1]
    request = pb.ReadRequest(lease_id=lease_id, handles=handles)
    i, received, hasher = 0, 0, xxhash.xxh3_64()
    for chunk in stub.Read(request, timeout=timeout_s):
        if i >= len(handles) or chunk.handle != handles[i] or chunk.offset != received:
            raise KVStoreError(grpc.StatusCode.INTERNAL,
                               f"Read stream out of order: got handle {chunk.handle} offset "
                               f"{chunk.offset}, expected block {i} at offset {received}")
        end = received + len(chunk.data)
        dst[i, received:end] = np.frombuffer(chunk.data, np.uint8)
        hasher.update(chunk.data)
        received = end
        if received == block_bytes:
            if hasher.intdigest() != chunk.checksum:
                raise ChecksumMismatch(grpc.StatusCode.DATA_LOSS,
                                       f"handle {chunk.handle}: received with xxh3_64 "
                                       f"{hasher.intdigest():#x}, but it was sealed with "
                                       f"{chunk.checksum:#x}")
            i, received, hasher = i + 1, 0, xxhash.xxh3_64()
    if i != len(handles):
        raise KVStoreError(grpc.StatusCode.INTERNAL,
                           f"Read stream ended after {i} of {len(handles)} blocks")
