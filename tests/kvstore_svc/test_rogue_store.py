"""A worker checks what a store answers before mapping or indexing memory by it (issue 13,
item 7): sizes that do not add up and handles outside the pool are refused, not used."""

from __future__ import annotations

from concurrent import futures

import grpc
import pytest

from fastserve.proto import kvstore_pb2 as pb
from fastserve.proto import kvstore_pb2_grpc
from kvstore_svc.client import KVStoreClient
from kvstore_svc.errors import KVStoreError
from kvstore_svc.pool import BlockPool
from kvstore_svc.server import KVStoreServicer

BLOCK = 4096


class _Segment:
    def __init__(self, size):
        self._buf = bytearray(size)

    @property
    def name(self):
        return ""  # no shared memory: the gRPC path

    @property
    def buf(self):
        return memoryview(self._buf)

    def close(self):
        pass


class Rogue(KVStoreServicer):
    def __init__(self, register=None, handles=None):
        super().__init__(BlockPool(6 * BLOCK, _Segment))  # slots 6 and 7 do not exist
        self.register_changes = register or {}
        self.handles = handles

    def Register(self, request, context):
        r = super().Register(request, context)
        for k, v in self.register_changes.items():
            setattr(r, k, v)
        return r

    def Allocate(self, request, context):
        r = super().Allocate(request, context)
        if self.handles is not None:
            return pb.AllocateResponse(handles=self.handles(list(r.handles)))
        return r


def serve(servicer):
    server = grpc.server(futures.ThreadPoolExecutor(4))
    kvstore_pb2_grpc.add_KVStoreServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


@pytest.mark.parametrize("changes,words", [
    ({"block_bytes": 2048}, "block_bytes 2048, not the 4096"),
    ({"capacity_blocks": 0}, "capacity_blocks 0"),
    ({"slot_bits": 1}, "slot_bits 1 cannot number"),
    ({"segment_bytes": 1 << 40}, "segment_bytes"),
])
def test_a_register_answer_that_does_not_add_up_is_refused(changes, words):
    server, address = serve(Rogue(register=changes))
    try:
        with pytest.raises(KVStoreError) as e:
            KVStoreClient(address, client_id="w", block_bytes=BLOCK, timeout_s=5)
        assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
        assert words in str(e.value)
    finally:
        server.stop(0)


@pytest.mark.parametrize("tamper", [
    lambda hs: hs[:1],  # fewer than asked
    lambda hs: [hs[0], hs[0]],  # one slot twice
    lambda hs: [h | 6 for h in hs],  # slots 6 and 7: past the pool
])
def test_handles_outside_the_pool_or_sharing_a_slot_are_not_used(tamper):
    server, address = serve(Rogue(handles=tamper))
    try:
        with KVStoreClient(address, client_id="w", block_bytes=BLOCK, timeout_s=5) as c, \
                pytest.raises(KVStoreError, match="Allocate answered"):
            c.allocate(job_key=1, n=2)
    finally:
        server.stop(0)


def test_an_honest_store_still_serves():
    server, address = serve(Rogue())
    try:
        with KVStoreClient(address, client_id="w", block_bytes=BLOCK, timeout_s=5) as c:
            assert len(c.allocate(job_key=1, n=2)) == 2
    finally:
        server.stop(0)
