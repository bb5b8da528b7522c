"""The store's gRPC service (fastserve.v1.KVStore): a thin layer over the block pool.

Each RPC is one pool call (or, for the streams, one per chunk), so every rule lives in
``pool.py``; a ``PoolError`` becomes the gRPC status of the same name. The pool's lock makes
the calls of many gRPC threads safe together.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from concurrent import futures
from dataclasses import dataclass
from typing import NoReturn

import grpc
import xxhash
from grpc_health.v1 import health

from fastserve.proto import kvstore_pb2 as pb
from fastserve.proto import kvstore_pb2_grpc
from fastserve.serving import start_with_health
from fastserve.tls import Tls
from kvstore_svc.metrics import StoreMetrics
from kvstore_svc.pool import BlockPool, ErrorCode, PoolError
from kvstore_svc.protocol import CHANNEL_OPTIONS, CHUNK_BYTES, ERROR_KEY, LEASE_UNKNOWN

log = logging.getLogger(__name__)

SERVICE_NAME = pb.DESCRIPTOR.services_by_name["KVStore"].full_name


def peer_identity(context: grpc.ServicerContext) -> str:
    """Who the transport proved the caller to be: a digest of the certificate it presented
    (mutual TLS), or "" on plaintext (loopback only, ``fastserve.tls.check_plaintext``)."""
    certs = context.auth_context().get("x509_pem_cert")
    return hashlib.sha256(certs[0]).hexdigest()[:32] if certs else ""


def _abort(context: grpc.ServicerContext, e: PoolError) -> NoReturn:
    if e.lease_unknown:
        context.set_trailing_metadata(((ERROR_KEY, LEASE_UNKNOWN),))
    context.abort(grpc.StatusCode[e.code.name], e.message)
    raise AssertionError("unreachable: context.abort raises")


@dataclass
class _Incoming:
    """The block a Write stream is filling."""

    handle: int
    checksum: int
    received: int
    hasher: xxhash.xxh3_64


class KVStoreServicer(kvstore_pb2_grpc.KVStoreServicer):
    """Serves one pool; ``metrics`` (optional) is told of transfers, refusals and expiries."""

    def __init__(self, pool: BlockPool, metrics: StoreMetrics | None = None):
        self.pool = pool
        self.metrics = metrics

    def Register(self, request: pb.RegisterRequest,
                 context: grpc.ServicerContext) -> pb.RegisterResponse:
        try:
            g = self.pool.register(request.client_id, request.block_bytes,
                                   peer_identity(context))
        except PoolError as e:
            _abort(context, e)
        log.info("lease %d registered by %r from %s", g.lease_id, request.client_id,
                 context.peer())
        return pb.RegisterResponse(lease_id=g.lease_id, lease_ttl_s=g.lease_ttl_s,
                                   segment_name=g.segment_name, segment_bytes=g.segment_bytes,
                                   block_bytes=g.block_bytes, capacity_blocks=g.capacity_blocks,
                                   slot_bits=g.slot_bits, max_chunk_bytes=CHUNK_BYTES)

    def KeepAlive(self, request: pb.KeepAliveRequest,
                  context: grpc.ServicerContext) -> pb.KeepAliveResponse:
        try:
            self.pool.check_holder(request.lease_id, peer_identity(context))
            return pb.KeepAliveResponse(lease_ttl_s=self.pool.keep_alive(request.lease_id))
        except PoolError as e:
            _abort(context, e)

    def Release(self, request: pb.ReleaseRequest,
                context: grpc.ServicerContext) -> pb.ReleaseResponse:
        try:
            self.pool.check_holder(request.lease_id, peer_identity(context))
            freed = self.pool.release(request.lease_id)
        except PoolError as e:
            _abort(context, e)
        log.info("lease %d released (%d blocks freed)", request.lease_id, freed)
        return pb.ReleaseResponse(num_freed=freed)

    def Allocate(self, request: pb.AllocateRequest,
                 context: grpc.ServicerContext) -> pb.AllocateResponse:
        try:
            self.pool.check_holder(request.lease_id, peer_identity(context))
            handles = self.pool.allocate(request.lease_id, request.job_key, request.n)
        except PoolError as e:
            if e.code is ErrorCode.RESOURCE_EXHAUSTED and self.metrics is not None:
                self.metrics.refusals.inc()
            _abort(context, e)
        return pb.AllocateResponse(handles=handles)

    def Free(self, request: pb.FreeRequest, context: grpc.ServicerContext) -> pb.FreeResponse:
        try:
            self.pool.check_holder(request.lease_id, peer_identity(context))
            return pb.FreeResponse(num_freed=self.pool.free(request.lease_id, request.handles))
        except PoolError as e:
            _abort(context, e)

    def FreeJob(self, request: pb.FreeJobRequest,
                context: grpc.ServicerContext) -> pb.FreeJobResponse:
        try:
            self.pool.check_holder(request.lease_id, peer_identity(context))
            return pb.FreeJobResponse(handles=self.pool.free_job(request.lease_id,
                                                                 request.job_key))
        except PoolError as e:
            _abort(context, e)

    def Seal(self, request: pb.SealRequest, context: grpc.ServicerContext) -> pb.SealResponse:
        start = time.perf_counter()
        try:
            self.pool.check_holder(request.lease_id, peer_identity(context))
            self.pool.seal(request.lease_id, request.handles, request.checksums)
        except PoolError as e:
            _abort(context, e)
        if self.metrics is not None:
            self.metrics.observe_write("shm", len(request.handles) * self.pool.block_bytes,
                                       time.perf_counter() - start)
        return pb.SealResponse()

    def GetChecksums(self, request: pb.GetChecksumsRequest,
                     context: grpc.ServicerContext) -> pb.GetChecksumsResponse:
        start = time.perf_counter()
        try:
            self.pool.check_holder(request.lease_id, peer_identity(context))
            sums = self.pool.checksums(request.lease_id, request.handles)
        except PoolError as e:
            _abort(context, e)
        if self.metrics is not None:
            self.metrics.observe_read("shm", len(sums) * self.pool.block_bytes,
                                      time.perf_counter() - start)
        return pb.GetChecksumsResponse(checksums=sums)

    def Write(self, request_iterator: Iterator[pb.WriteChunk],
              context: grpc.ServicerContext) -> pb.WriteResponse:
        start = time.perf_counter()
        block_bytes = self.pool.block_bytes
        lease_id: int | None = None
        block: _Incoming | None = None
        num_blocks = 0
        try:
            for chunk in request_iterator:
                if lease_id is None:
                    lease_id = chunk.lease_id
                    self.pool.check_holder(lease_id, peer_identity(context))
                elif chunk.lease_id != lease_id:
                    raise PoolError(ErrorCode.INVALID_ARGUMENT,
                                    f"lease_id: {chunk.lease_id} differs from the stream's "
                                    f"first chunk ({lease_id}); one lease per stream")
                if block is None:
                    if chunk.offset != 0:
                        raise PoolError(ErrorCode.INVALID_ARGUMENT,
                                        f"offset: the first chunk of handle {chunk.handle} must "
                                        f"be at offset 0, got {chunk.offset}")
                    block = _Incoming(chunk.handle, chunk.checksum, 0, xxhash.xxh3_64())
                elif chunk.handle != block.handle or chunk.offset != block.received:
                    raise PoolError(ErrorCode.INVALID_ARGUMENT,
                                    f"offset: handle {block.handle} has {block.received} of "
                                    f"{block_bytes} bytes; its next chunk must follow at offset "
                                    f"{block.received} (got handle {chunk.handle} offset "
                                    f"{chunk.offset}); blocks are written one at a time, in order")
                if not 1 <= len(chunk.data) <= CHUNK_BYTES:
                    raise PoolError(ErrorCode.INVALID_ARGUMENT,
                                    f"data: a chunk carries 1 to max_chunk_bytes={CHUNK_BYTES} "
                                    f"bytes, got {len(chunk.data)}")
                self.pool.write(lease_id, chunk.handle, chunk.offset, chunk.data)
                block.hasher.update(chunk.data)
                block.received += len(chunk.data)
                if block.received == block_bytes:
                    self._seal_verified(lease_id, block)
                    num_blocks += 1
                    block = None
            if block is not None:
                raise PoolError(ErrorCode.INVALID_ARGUMENT,
                                f"data: the stream ended with handle {block.handle} incomplete "
                                f"({block.received} of block_bytes={block_bytes} bytes)")
        except PoolError as e:
            _abort(context, e)
        if self.metrics is not None:
            self.metrics.observe_write("grpc", num_blocks * block_bytes,
                                       time.perf_counter() - start)
        return pb.WriteResponse(num_blocks=num_blocks)

    def _seal_verified(self, lease_id: int, block: _Incoming) -> None:
        actual = block.hasher.intdigest()
        if actual != block.checksum:
            raise PoolError(ErrorCode.DATA_LOSS,
                            f"checksum: handle {block.handle} arrived with xxh3_64 {actual:#x}, "
                            f"the sender declared {block.checksum:#x}; the block stays unwritten")
        self.pool.seal(lease_id, [block.handle], [actual])

    def Read(self, request: pb.ReadRequest,
             context: grpc.ServicerContext) -> Iterator[pb.ReadChunk]:
        start = time.perf_counter()
        block_bytes = self.pool.block_bytes
        try:
            self.pool.check_holder(request.lease_id, peer_identity(context))
            sums = self.pool.checksums(request.lease_id, request.handles)
            for handle, checksum in zip(request.handles, sums):
                for offset in range(0, block_bytes, CHUNK_BYTES):
                    data = self.pool.read(request.lease_id, handle, offset,
                                          min(CHUNK_BYTES, block_bytes - offset))
                    yield pb.ReadChunk(handle=handle, offset=offset, data=data,
                                       checksum=checksum)
        except PoolError as e:
            _abort(context, e)
        if self.metrics is not None:
            self.metrics.observe_read("grpc", len(sums) * block_bytes,
                                      time.perf_counter() - start)

    def Stats(self, request: pb.StatsRequest, context: grpc.ServicerContext) -> pb.StatsResponse:
        s = self.pool.stats()
        return pb.StatsResponse(
            budget_bytes=s.budget_bytes, block_bytes=s.block_bytes,
            capacity_blocks=s.capacity_blocks, used_blocks=s.used_blocks,
            free_blocks=s.free_blocks, used_bytes=s.used_bytes, free_bytes=s.free_bytes,
            segment_name=s.segment_name,
            leases=[pb.LeaseStats(client_id=x.client_id,  # never the lease id
                                  used_blocks=x.used_blocks, num_jobs=x.num_jobs,
                                  expires_in_s=x.expires_in_s) for x in s.leases],
        )


def reap_expired(pool: BlockPool, metrics: StoreMetrics | None = None) -> None:
    """End the leases whose clients stopped renewing them, and say so."""
    for lease, freed in pool.reap_expired():
        log.warning("lease %d of %r expired; %d blocks freed", lease.lease_id, lease.client_id,
                    freed)
        if metrics is not None:
            metrics.expired.inc()


def create_server(
    pool: BlockPool,
    address: str,
    *,
    health_servicer: health.HealthServicer | None = None,
    metrics: StoreMetrics | None = None,
    max_workers: int = 32,
    tls: Tls | None = None,
) -> tuple[grpc.Server, int]:
    """A started gRPC server for ``pool`` on ``address`` (port 0 picks a free port).

    Serves fastserve.v1.KVStore and the standard health service, SERVING for "" and the
    KVStore service; pass ``health_servicer`` to flip it to NOT_SERVING on shutdown. Each open
    stream holds one of ``max_workers`` threads. Returns the server and the bound port; raises
    RuntimeError when ``address`` cannot be bound.
    """
    server = grpc.server(
        futures.ThreadPoolExecutor(max_workers=max_workers, thread_name_prefix="kvstore-rpc"),
        options=CHANNEL_OPTIONS,
    )
    kvstore_pb2_grpc.add_KVStoreServicer_to_server(KVStoreServicer(pool, metrics), server)
    return server, start_with_health(server, address, SERVICE_NAME, health_servicer, tls)
