"""A real store process: leases and their expiry, restarts, bad input, health, metrics, exit."""

from __future__ import annotations

import time

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc
from procs import free_port, scrape_metrics, start_kvstore
from store_helpers import BLOCK, BUDGET, blocks, metrics_port, raw_stub

from fastserve.proto import kvstore_pb2 as pb
from kvstore_svc.client import KVStoreError, StoreUnavailable
from kvstore_svc.server import ERROR_KEY, LEASE_UNKNOWN, SERVICE_NAME
from kvstore_svc.shm import SHM_DIR


def wait_until(predicate, timeout_s: float = 10.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_free_job_and_release_return_usage_to_zero(store, connect):
    a = connect(store, client_id="a")
    b = connect(store, client_id="b")
    a.write(a.allocate(job_key=1, n=3), blocks(3))
    a.allocate(job_key=2, n=2)
    b.allocate(job_key=1, n=4)
    leases = {x["client_id"]: x for x in a.stats()["leases"]}
    assert (leases["a"]["used_blocks"], leases["a"]["num_jobs"]) == (5, 2)
    assert leases["b"]["used_blocks"] == 4
    assert a.free_job(1) == 3
    assert a.free_job(1) == 0
    assert a.free_job(2) == 2
    b.close()
    stats = a.stats()
    assert [x["client_id"] for x in stats["leases"]] == ["a"]
    assert stats["used_blocks"] == 0 and stats["used_bytes"] == 0
    assert stats["free_bytes"] == stats["capacity_blocks"] * BLOCK == BUDGET // BLOCK * BLOCK


def test_lease_without_keepalives_is_reclaimed(logs, connect):
    store = start_kvstore(logs, BUDGET, "--lease-ttl-s", "1.5", "--metrics-port", "0",
                          name="kvstore-ttl")
    try:
        stub = raw_stub(store.address)
        silent = stub.Register(pb.RegisterRequest(client_id="silent", block_bytes=BLOCK))
        stub.Allocate(pb.AllocateRequest(lease_id=silent.lease_id, job_key=1, n=5))
        alive = connect(store, client_id="alive")  # renews every ttl/3 from its thread
        data = blocks(2, seed=1)
        handles = alive.allocate(job_key=1, n=2)
        alive.write(handles, data)
        assert alive.stats()["used_blocks"] == 7

        stats = wait_until(lambda: (s := alive.stats())["used_blocks"] == 2 and s, 10.0,
                           "the silent lease to expire")
        assert [x["client_id"] for x in stats["leases"]] == ["alive"]
        with pytest.raises(grpc.RpcError) as e:
            stub.Allocate(pb.AllocateRequest(lease_id=silent.lease_id, job_key=1, n=1))
        assert e.value.code() == grpc.StatusCode.NOT_FOUND
        assert "unknown (expired or store restarted)" in e.value.details()
        assert (ERROR_KEY, LEASE_UNKNOWN) in tuple(e.value.trailing_metadata())
        assert len(stats["leases"]) == 1  # kept, not re-registered
        assert all(x.lease_id == 0 for x in stub.Stats(pb.StatsRequest()).leases)  # never listed
        out = torch.empty_like(data)
        alive.read(handles, out)
        assert torch.equal(out, data)
        assert scrape_metrics(metrics_port(store))[
            ("fastserve:kvstore_leases_expired_total", frozenset())] == 1
    finally:
        assert store.stop() == 0, store.log()


def test_client_registers_again_after_the_store_restarts(logs, connect):
    address = f"127.0.0.1:{free_port()}"
    store = start_kvstore(logs, BUDGET, "--listen", address, name="kvstore-1")
    restarted = None
    try:
        client = connect(store, timeout_s=2.0)
        old_lease, old_segment = client.lease_id, client.stats()["segment_name"]
        data = blocks(2, seed=2)
        handles = client.allocate(job_key=1, n=2)
        client.write(handles, data)
        store.kill()
        with pytest.raises(StoreUnavailable):
            client.allocate(job_key=2, n=1)
        with pytest.raises(StoreUnavailable):
            client.read(handles, torch.empty_like(data))
        # SIGKILL skips our cleanup; the store's resource_tracker unlinks the segment.
        wait_until(lambda: not (SHM_DIR / old_segment).exists(), 10.0, "the old segment to go")

        restarted = start_kvstore(logs, BUDGET, "--listen", address, name="kvstore-2")
        fresh = wait_until(lambda: _try_allocate(client), 10.0, "the store to be reachable")
        assert client.lease_id != old_lease and client.same_node
        assert client.stats()["segment_name"] != old_segment
        client.write(fresh, data)
        # Old handles name the same slots in the new segment: they must not reach them.
        for call in (lambda: client.read(handles, torch.empty_like(data)),
                     lambda: client.write(handles, blocks(2, seed=3)),
                     lambda: client.free(handles)):
            with pytest.raises(KVStoreError) as e:
                call()
            assert e.value.code == grpc.StatusCode.NOT_FOUND
        out = torch.empty_like(data)
        client.read(fresh, out)
        assert torch.equal(out, data)
    finally:
        store.stop()
        if restarted is not None:
            assert restarted.stop() == 0, restarted.log()


def _try_allocate(client) -> list[int] | None:
    try:
        return client.allocate(job_key=3, n=2)
    except StoreUnavailable:
        return None


def test_bad_input_is_invalid_argument_and_disturbs_no_one(store, connect):
    bystander = connect(store, client_id="bystander")
    data = blocks(1, seed=3)
    kept = bystander.allocate(job_key=1, n=1)
    bystander.write(kept, data)
    stub = raw_stub(store.address)
    lease = stub.Register(pb.RegisterRequest(client_id="bad", block_bytes=BLOCK))
    (h,) = stub.Allocate(pb.AllocateRequest(lease_id=lease.lease_id, job_key=1, n=1)).handles
    capacity = lease.capacity_blocks
    cases = [
        (lambda: stub.Register(pb.RegisterRequest(client_id="", block_bytes=BLOCK)),
         "client_id:"),
        (lambda: stub.Allocate(pb.AllocateRequest(lease_id=lease.lease_id, n=0)), "n:"),
        (lambda: stub.Allocate(pb.AllocateRequest(lease_id=lease.lease_id, n=capacity + 1)),
         f"n: must be in [1, capacity_blocks={capacity}]"),
        (lambda: stub.Free(pb.FreeRequest(lease_id=lease.lease_id, handles=[h, h])),
         "handles:"),
        (lambda: stub.Seal(pb.SealRequest(lease_id=lease.lease_id, handles=[h])), "checksums:"),
        (lambda: stub.Allocate(pb.AllocateRequest(n=1)), "lease_id:"),
        (lambda: stub.Write(iter([pb.WriteChunk(lease_id=lease.lease_id, handle=h,
                                                offset=BLOCK - 1, data=b"ab")])), "offset:"),
        (lambda: stub.Write(iter([pb.WriteChunk(lease_id=lease.lease_id, handle=h,
                                                data=b"")])), "data:"),
    ]
    for call, prefix in cases:
        with pytest.raises(grpc.RpcError) as e:
            call()
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT, e.value.details()
        assert e.value.details().startswith(prefix), e.value.details()
    with pytest.raises(KVStoreError) as e2:
        connect(store, block_bytes=BLOCK + 1)
    assert e2.value.code == grpc.StatusCode.FAILED_PRECONDITION
    assert str(BLOCK) in str(e2.value) and str(BLOCK + 1) in str(e2.value)
    out = torch.empty_like(data)
    bystander.read(kept, out)
    assert torch.equal(out, data)


def test_health_is_serving(store):
    stub = health_pb2_grpc.HealthStub(grpc.insecure_channel(store.address))
    for name in ("", SERVICE_NAME):
        r = stub.Check(health_pb2.HealthCheckRequest(service=name), timeout=5)
        assert r.status == health_pb2.HealthCheckResponse.SERVING


def test_metrics_show_usage_and_transfers(store, connect):
    port = metrics_port(store)
    client = connect(store)
    before = scrape_metrics(port)
    handles = client.allocate(job_key=1, n=4)
    client.write(handles, blocks(4))
    client.read(handles, torch.empty(4, BLOCK, dtype=torch.uint8))
    after = scrape_metrics(port)
    stats = client.stats()

    def gauge(name: str) -> float:
        return after[(f"fastserve:kvstore_{name}", frozenset())]

    assert gauge("budget_bytes") == BUDGET
    assert gauge("bytes_used") == stats["used_bytes"] >= 4 * BLOCK
    assert gauge("bytes_free") == stats["free_bytes"]
    assert gauge("blocks_used") + gauge("blocks_free") == gauge("blocks_capacity")
    assert gauge("leases") == len(stats["leases"])
    shm = frozenset({("path", "shm")})
    for name in ("write_bytes_total", "read_bytes_total"):
        key = (f"fastserve:kvstore_{name}", shm)
        assert after[key] - before.get(key, 0.0) == 4 * BLOCK
    assert after[("fastserve:kvstore_write_seconds_count", shm)] >= 1


def test_sigterm_exits_cleanly_and_unlinks_the_segment(logs, connect):
    store = start_kvstore(logs, BUDGET, "--block-bytes", str(BLOCK), name="kvstore-term")
    segment = connect(store).stats()["segment_name"]
    assert (SHM_DIR / segment).exists()
    assert store.stop() == 0, store.log()
    assert not (SHM_DIR / segment).exists()
