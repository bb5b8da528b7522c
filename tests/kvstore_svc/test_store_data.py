"""Blocks in and out of a real store process: both data paths, checksums, a full pool."""

from __future__ import annotations

import threading

import grpc
import pytest
import torch
import xxhash
from procs import start_kvstore
from store_helpers import BLOCK, blocks, raw_stub

from fastserve.proto import kvstore_pb2 as pb
from kvstore_svc import shm
from kvstore_svc.client import ChecksumMismatch, KVStoreError, StoreFull
from kvstore_svc.server import CHUNK_BYTES


def test_shm_round_trip_is_byte_identical(store, connect):
    client = connect(store)
    assert client.same_node and client.block_bytes == BLOCK
    data = blocks(12)
    handles = client.allocate(job_key=1, n=12)
    client.write(handles, data)
    out = torch.zeros_like(data)
    client.read(handles, out)
    assert torch.equal(out, data)
    # Any order, any subset, and a destination whose rows are not adjacent.
    picked = [handles[7], handles[2], handles[11]]
    wide = torch.zeros(3, BLOCK + 5, dtype=torch.uint8)
    client.read(picked, wide[:, :BLOCK])
    assert torch.equal(wide[:, :BLOCK], data[[7, 2, 11]])
    assert not wide[:, BLOCK:].any()
    # Even a layout whose rows are not contiguous (staged through a temporary).
    columns = torch.zeros(BLOCK, 2, dtype=torch.uint8).t()
    client.read(handles[:2], columns)
    assert torch.equal(columns, data[:2])
    client.write(handles[:2], data[4:6].t().contiguous().t())
    client.read(handles[:2], out[:2])
    assert torch.equal(out[:2], data[4:6])
    client.free(handles)


def test_views_then_seal_is_readable_over_both_paths(store, connect):
    client = connect(store)
    other = connect(store, prefer_shm=False)
    data = blocks(3, seed=1)
    handles = client.allocate(job_key=2, n=3)
    for view, row in zip(client.views(handles), data):
        view.copy_(row)  # a caller filling the slots itself, e.g. from the GPU
    with pytest.raises(KVStoreError) as e:
        client.read(handles, torch.empty_like(data))  # not sealed yet
    assert e.value.code == grpc.StatusCode.FAILED_PRECONDITION
    client.seal(handles)
    out = torch.empty_like(data)
    client.read(handles, out)
    assert torch.equal(out, data)
    # Handles belong to their lease: another client cannot read them.
    with pytest.raises(KVStoreError) as e:
        other.read(handles, out)
    assert e.value.code == grpc.StatusCode.NOT_FOUND


def test_grpc_round_trip_with_blocks_larger_than_a_chunk(logs, connect):
    big = 2 * CHUNK_BYTES + CHUNK_BYTES // 2 + 7  # three chunks, the last one partial
    store = start_kvstore(logs, 6 * big, name="kvstore-big")
    try:
        client = connect(store, block_bytes=big, prefer_shm=False)
        assert not client.same_node
        data = blocks(4, big, seed=2)
        handles = client.allocate(job_key=1, n=4)
        client.write(handles, data)
        out = torch.zeros_like(data)
        client.read(handles, out)
        assert torch.equal(out, data)
        # Written over gRPC, read through shared memory by a client on this node.
        local = connect(store, block_bytes=big)
        assert local.same_node
        stub = raw_stub(store.address)
        mine = local.allocate(job_key=1, n=1)
        chunks = [pb.WriteChunk(lease_id=local.lease_id, handle=mine[0], offset=off,
                                data=data[3, off:off + CHUNK_BYTES].numpy().tobytes(),
                                checksum=xxhash.xxh3_64_intdigest(data[3].numpy()))
                  for off in range(0, big, CHUNK_BYTES)]
        assert stub.Write(iter(chunks)).num_blocks == 1
        one = torch.zeros(1, big, dtype=torch.uint8)
        local.read(mine, one)
        assert torch.equal(one[0], data[3])
    finally:
        assert store.stop() == 0, store.log()


def test_corrupted_slot_is_detected_on_both_paths(store, connect):
    client = connect(store)
    remote = connect(store, prefer_shm=False)
    data = blocks(4, seed=3)
    handles = client.allocate(job_key=3, n=4)
    client.write(handles, data)
    client.views([handles[2]])[0][1000] ^= 0xFF  # a bit flip in host memory, not sealed
    with pytest.raises(ChecksumMismatch) as e:
        client.read(handles, torch.empty_like(data))
    assert e.value.code == grpc.StatusCode.DATA_LOSS and str(handles[2]) in str(e.value)
    client.free(handles)
    # The gRPC path verifies on the client too: the store streams whatever its slot holds.
    theirs = remote.allocate(job_key=3, n=2)
    remote.write(theirs, data[:2])
    stats = remote.stats()
    mapped = shm.attach(stats["segment_name"], stats["capacity_blocks"] * BLOCK)
    mapped[(theirs[1] & remote._lease.slot_mask) * BLOCK + 7] ^= 0xFF
    mapped.close()
    with pytest.raises(ChecksumMismatch) as e:
        remote.read(theirs, torch.empty(2, BLOCK, dtype=torch.uint8))
    assert str(theirs[1]) in str(e.value)


def test_bad_checksum_on_grpc_write_is_data_loss_and_unreadable(store, connect):
    client = connect(store, prefer_shm=False)
    (h,) = client.allocate(job_key=4, n=1)
    row = blocks(1, seed=4)[0].numpy()
    good = xxhash.xxh3_64_intdigest(row)
    chunks = [pb.WriteChunk(lease_id=client.lease_id, handle=h, offset=off,
                            data=row[off:off + CHUNK_BYTES].tobytes(), checksum=good ^ 1)
              for off in range(0, BLOCK, CHUNK_BYTES)]
    with pytest.raises(grpc.RpcError) as e:
        raw_stub(store.address).Write(iter(chunks))
    assert e.value.code() == grpc.StatusCode.DATA_LOSS
    assert str(h) in e.value.details() and "checksum" in e.value.details()
    with pytest.raises(KVStoreError) as e2:
        client.read([h], torch.empty(1, BLOCK, dtype=torch.uint8))
    assert e2.value.code == grpc.StatusCode.FAILED_PRECONDITION


def test_full_store_refuses_and_loses_nothing(logs, connect):
    store = start_kvstore(logs, 10 * BLOCK + 1, name="kvstore-small")
    try:
        client = connect(store)
        data = blocks(8, seed=5)
        held = client.allocate(job_key=1, n=8)
        client.write(held, data)
        with pytest.raises(StoreFull) as e:
            client.allocate(job_key=2, n=3)
        assert e.value.code == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "requested 3" in str(e.value) and "2 free" in str(e.value)
        out = torch.empty_like(data)
        client.read(held, out)
        assert torch.equal(out, data)
        assert client.stats()["free_blocks"] == 2
        assert len(client.allocate(job_key=2, n=2)) == 2
    finally:
        assert store.stop() == 0, store.log()


def test_client_copies_only_into_slots_it_holds(store, connect):
    client = connect(store)
    other = connect(store, client_id="other")
    theirs = other.allocate(job_key=1, n=1)
    other.write(theirs, blocks(1, seed=6))
    with pytest.raises(KVStoreError) as e:
        client.write(theirs, blocks(1, seed=7))  # would overwrite another lease's slot
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    with pytest.raises(KVStoreError):
        client.views(theirs)
    out = torch.empty(1, BLOCK, dtype=torch.uint8)
    other.read(theirs, out)
    assert torch.equal(out, blocks(1, seed=6))
    mine = client.allocate(job_key=1, n=2)
    with pytest.raises(ValueError, match=r"data: expected a CPU uint8 tensor of shape \[2, "):
        client.write(mine, torch.zeros(2, BLOCK, dtype=torch.int16))
    with pytest.raises(KVStoreError) as e:
        client.free([mine[0], theirs[0]])  # all or nothing: mine stays held, and usable
    assert e.value.code == grpc.StatusCode.NOT_FOUND
    client.write(mine, blocks(2, seed=8))
    client.free(mine)


def test_concurrent_copies_and_frees_from_several_threads(store, connect):
    client = connect(store)
    errors: list[BaseException] = []

    def churn(seed: int) -> None:
        try:
            for i in range(15):
                data = blocks(3, seed=seed * 100 + i)
                handles = client.allocate(job_key=seed * 100 + i, n=3)
                client.write(handles, data)
                out = torch.empty_like(data)
                client.read(handles, out)
                assert torch.equal(out, data)
                if i % 2:
                    client.free(handles)
                else:
                    assert client.free_job(seed * 100 + i) == 3
        except BaseException as e:  # noqa: BLE001 - reported by the main thread
            errors.append(e)

    threads = [threading.Thread(target=churn, args=(s,)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors, errors
    mine = [x for x in client.stats()["leases"] if x["client_id"] == client.client_id]
    assert mine[0]["used_blocks"] == 0
