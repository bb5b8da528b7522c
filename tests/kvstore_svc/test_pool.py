"""The block pool's rules, driven directly: no process, no gRPC, memory in a bytearray."""

from __future__ import annotations

import pytest

from kvstore_svc.pool import BlockPool, ErrorCode, PoolError

BLOCK = 64


class ByteSegment:
    """A segment in process memory, recording that it was closed."""

    def __init__(self, size: int):
        self.size = size
        self._buf = bytearray(size)
        self.closed = False

    @property
    def name(self) -> str:
        return f"bytes-{self.size}"

    @property
    def buf(self) -> memoryview:
        return memoryview(self._buf)

    def close(self) -> None:
        self.closed = True


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def make_pool(blocks: int = 8, **overrides) -> tuple[BlockPool, list[ByteSegment], Clock]:
    segments: list[ByteSegment] = []
    clock = Clock()

    def new_segment(size: int) -> ByteSegment:
        segments.append(ByteSegment(size))
        return segments[-1]

    kwargs = {"lease_ttl_s": 10.0, "clock": clock, **overrides}
    return BlockPool(blocks * BLOCK + BLOCK // 2, new_segment, **kwargs), segments, clock


def refused(code: ErrorCode, fn, *args) -> PoolError:
    with pytest.raises(PoolError) as e:
        fn(*args)
    assert e.value.code is code, e.value.message
    return e.value


def fill(pool: BlockPool, lease: int, handle: int, byte: int) -> None:
    pool.write(lease, handle, 0, bytes([byte]) * BLOCK)
    pool.seal(lease, [handle], [byte])


def test_segment_is_created_by_the_first_register_and_sized_by_it():
    pool, segments, _ = make_pool(blocks=8)
    assert segments == [] and pool.stats().capacity_blocks == 0
    grant = pool.register("w0", BLOCK)
    assert [s.size for s in segments] == [8 * BLOCK]  # budget // block_bytes, remainder unused
    assert (grant.capacity_blocks, grant.block_bytes, grant.segment_bytes) == (8, BLOCK, 8 * BLOCK)
    assert grant.segment_name == segments[0].name
    pool.close()
    assert segments[0].closed


def test_block_bytes_mismatch_names_both_values():
    pool, _, _ = make_pool()
    pool.register("w0", BLOCK)
    e = refused(ErrorCode.FAILED_PRECONDITION, pool.register, "w1", 128)
    assert str(BLOCK) in e.message and "128" in e.message
    fixed, _, _ = make_pool(block_bytes=32)
    e = refused(ErrorCode.FAILED_PRECONDITION, fixed.register, "w0", BLOCK)
    assert "32" in e.message and str(BLOCK) in e.message


def test_allocation_is_all_or_nothing_and_refusal_keeps_data():
    pool, _, _ = make_pool(blocks=8)
    lease = pool.register("w0", BLOCK).lease_id
    held = pool.allocate(lease, 1, 5)
    for i, h in enumerate(held):
        fill(pool, lease, h, i + 1)
    e = refused(ErrorCode.RESOURCE_EXHAUSTED, pool.allocate, lease, 2, 4)
    assert "requested 4" in e.message and "3 free" in e.message
    stats = pool.stats()
    assert (stats.used_blocks, stats.free_blocks) == (5, 3)  # nothing taken by the refusal
    for i, h in enumerate(held):
        assert pool.read(lease, h, 0, BLOCK) == bytes([i + 1]) * BLOCK
        assert pool.checksums(lease, [h]) == [i + 1]
    assert len(pool.allocate(lease, 2, 3)) == 3  # exactly the rest still fits
    pool.check_invariants()


def test_handles_are_never_reissued_after_reuse():
    pool, _, _ = make_pool(blocks=4)
    lease = pool.register("w0", BLOCK).lease_id
    seen: set[int] = set()
    slots: set[int] = set()
    for job in range(200):
        handles = pool.allocate(lease, job, 1 + job % 4)
        assert seen.isdisjoint(handles)
        seen.update(handles)
        slots.update(h & ((1 << pool.slot_bits) - 1) for h in handles)
        pool.free(lease, handles)
    assert slots == {0, 1, 2, 3}  # slots were reused, handles never
    stale = next(iter(seen))
    e = refused(ErrorCode.NOT_FOUND, pool.free, lease, [stale])
    assert str(stale) in e.message and not e.lease_unknown
    refused(ErrorCode.NOT_FOUND, pool.write, lease, stale, 0, b"x")
    pool.check_invariants()


def test_free_and_free_job_return_usage_and_stay_within_the_lease():
    pool, _, _ = make_pool(blocks=8)
    a = pool.register("a", BLOCK).lease_id
    b = pool.register("b", BLOCK).lease_id
    a1, a2 = pool.allocate(a, 1, 3), pool.allocate(a, 2, 2)
    b1 = pool.allocate(b, 1, 2)
    fill(pool, b, b1[0], 7)
    refused(ErrorCode.NOT_FOUND, pool.free, b, [a1[0]])  # another lease's handle
    refused(ErrorCode.NOT_FOUND, pool.free, a, [a1[0], b1[0]])  # all or nothing
    assert pool.stats().used_blocks == 7
    assert pool.free_job(a, 1) == sorted(a1)
    assert pool.free_job(a, 1) == []
    assert pool.free(a, a2[:1]) == 1
    by_lease = {x.client_id: x for x in pool.stats().leases}
    assert (by_lease["a"].used_blocks, by_lease["a"].num_jobs) == (1, 1)
    assert (by_lease["b"].used_blocks, by_lease["b"].num_jobs) == (2, 1)
    assert pool.release(a) == 1
    assert pool.read(b, b1[0], 0, BLOCK) == bytes([7]) * BLOCK  # b never disturbed
    assert pool.release(b) == 2
    stats = pool.stats()
    assert (stats.used_blocks, stats.free_blocks, stats.leases) == (0, 8, [])
    pool.check_invariants()


def test_expired_lease_is_reclaimed_and_unknown_afterwards():
    pool, _, clock = make_pool(blocks=8, lease_ttl_s=5.0)
    gone = pool.register("gone", BLOCK).lease_id
    kept = pool.register("kept", BLOCK).lease_id
    pool.allocate(gone, 1, 3)
    pool.allocate(kept, 1, 2)
    clock.now += 4.0
    pool.keep_alive(kept)
    clock.now += 2.0  # gone: 6 s since register; kept: 2 s since its keepalive
    reaped = pool.reap_expired()
    assert [(s.client_id, s.used_blocks, freed) for s, freed in reaped] == [("gone", 3, 3)]
    assert pool.stats().used_blocks == 2
    e = refused(ErrorCode.NOT_FOUND, pool.allocate, gone, 1, 1)
    assert e.lease_unknown and str(gone) in e.message
    clock.now += 10.0  # expired, not yet reaped: the next call sees it gone all the same
    assert refused(ErrorCode.NOT_FOUND, pool.keep_alive, kept).lease_unknown
    assert pool.stats().used_blocks == 0
    pool.check_invariants()


def test_unwritten_and_rewritten_blocks_are_not_readable():
    pool, _, _ = make_pool()
    lease = pool.register("w0", BLOCK).lease_id
    (h,) = pool.allocate(lease, 1, 1)
    e = refused(ErrorCode.FAILED_PRECONDITION, pool.checksums, lease, [h])
    assert str(h) in e.message
    refused(ErrorCode.FAILED_PRECONDITION, pool.read, lease, h, 0, BLOCK)
    fill(pool, lease, h, 3)
    pool.write(lease, h, 0, b"\x04")  # a rewrite unseals until the next seal
    refused(ErrorCode.FAILED_PRECONDITION, pool.checksums, lease, [h])


@pytest.mark.parametrize(("call", "field"), [
    (lambda p, lease, h: p.allocate(lease, 1, 0), "n:"),
    (lambda p, lease, h: p.allocate(lease, 1, 9), "n:"),
    (lambda p, lease, h: p.free(lease, [h, h]), "handles:"),
    (lambda p, lease, h: p.free(lease, list(range(9))), "handles:"),
    (lambda p, lease, h: p.seal(lease, [h], [1, 2]), "checksums:"),
    (lambda p, lease, h: p.write(lease, h, BLOCK - 1, b"ab"), "offset:"),
    (lambda p, lease, h: p.read(lease, h, 0, 0), "offset:"),
    (lambda p, lease, h: p.keep_alive(0), "lease_id:"),
    (lambda p, lease, h: p.register("", BLOCK), "client_id:"),
    (lambda p, lease, h: p.register("x" * 129, BLOCK), "client_id:"),
])
def test_bad_input_is_invalid_argument_naming_the_field(call, field):
    pool, _, _ = make_pool(blocks=8)
    lease = pool.register("w0", BLOCK).lease_id
    (h,) = pool.allocate(lease, 1, 1)
    e = refused(ErrorCode.INVALID_ARGUMENT, call, pool, lease, h)
    assert e.message.startswith(field), e.message
    pool.check_invariants()
    assert pool.stats().used_blocks == 1


def test_bad_block_bytes_at_first_register_leaves_the_pool_unsized():
    pool, segments, _ = make_pool(blocks=8)
    e = refused(ErrorCode.INVALID_ARGUMENT, pool.register, "w0", 0)
    assert e.message.startswith("block_bytes:")
    e = refused(ErrorCode.INVALID_ARGUMENT, pool.register, "w0", 9 * BLOCK)
    assert str(pool.budget_bytes) in e.message
    assert segments == []
    with pytest.raises(ValueError, match="block_bytes"):
        BlockPool(100, ByteSegment, block_bytes=101)


def test_a_lease_answers_only_its_holder():
    pool, _, _ = make_pool()
    lease = pool.register("worker-a", 64, holder="cert-a").lease_id
    pool.check_holder(lease, "cert-a")
    e = refused(ErrorCode.PERMISSION_DENIED, pool.check_holder, lease, "cert-b")
    assert "another client" in e.message
    refused(ErrorCode.PERMISSION_DENIED, pool.check_holder, lease, "")  # plaintext caller
    unknown = refused(ErrorCode.NOT_FOUND, pool.check_holder, lease + 1, "cert-a")
    assert unknown.lease_unknown
