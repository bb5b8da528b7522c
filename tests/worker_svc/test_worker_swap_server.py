"""A ``python -m worker_svc --kvstore`` process: Describe, swaps over the Step stream, and a
store that only comes up after the worker."""

from __future__ import annotations

import time

import grpc
from procs import free_port, start_kvstore
from test_worker_server import StepStream, Worker, new_job

from fastserve.proto import kvstore_pb2, kvstore_pb2_grpc
from fastserve.proto import worker_pb2 as pb


def store_used_blocks(address: str) -> int:
    with grpc.insecure_channel(address) as channel:
        stub = kvstore_pb2_grpc.KVStoreStub(channel)
        return stub.Stats(kvstore_pb2.StatsRequest(), timeout=10).used_blocks


def test_worker_starts_before_its_store_then_swaps(tiny_llama_dir, tmp_path):
    address = f"127.0.0.1:{free_port()}"
    worker = Worker(tiny_llama_dir, tmp_path, tmp_path / "worker.log", "--kvstore", address)
    kv = None
    try:
        d = worker.stub.Describe(pb.DescribeRequest(), timeout=10)
        assert (d.kvstore_address, d.store_connected,
                d.store_capacity_blocks) == (address, False, 0)

        stream = StepStream(worker.stub)
        prompt = list(range(1, 21))  # 20 tokens: 2 blocks
        r = stream.step(
            new_jobs=[new_job(1, prompt, [0, 1]), new_job(2, prompt, [2, 3])],
            commands=[pb.JobCommand(job_id=1, num_tokens=20),
                      pb.JobCommand(job_id=2, num_tokens=20)],
        )
        assert not r.errors
        r = stream.step(swap_out=[pb.SwapOut(job_id=1)])
        assert [(e.job_id, e.code) for e in r.errors] == [(1, pb.ERROR_CODE_UNAVAILABLE)]
        assert "not connected" in r.errors[0].message
        assert r.swap.failures == {"out:store_unavailable": 1}
        assert r.num_used_blocks == 4  # refused: job 1 keeps its blocks

        kv = start_kvstore(tmp_path, 64 * d.kv_bytes_per_block, "--listen", address)
        deadline = time.monotonic() + 20
        while (r := stream.step(swap_out=[pb.SwapOut(job_id=1)])).errors:
            assert r.errors[0].code == pb.ERROR_CODE_UNAVAILABLE
            assert time.monotonic() < deadline, worker.log()
            time.sleep(0.2)
        assert r.num_used_blocks == 2 and r.swap.num_offloaded_jobs == 1
        d = worker.stub.Describe(pb.DescribeRequest(), timeout=10)
        assert d.store_connected and d.store_same_node
        assert (d.store_capacity_blocks, d.store_block_bytes) == (64, d.kv_bytes_per_block)

        # Commanding an offloaded job is refused; after a SwapIn (to other blocks) it runs on
        # exactly like the job that never left the device.
        r = stream.step(commands=[pb.JobCommand(job_id=1, num_tokens=1)])
        assert [(e.job_id, e.code) for e in r.errors] == [(1, pb.ERROR_CODE_FAILED_PRECONDITION)]
        r = stream.step(
            swap_in=[pb.SwapIn(job_id=1, block_ids=[7, 5])],
            commands=[pb.JobCommand(job_id=1, num_tokens=1), pb.JobCommand(job_id=2, num_tokens=1)],
        )
        assert not r.errors, r.errors
        assert r.results[0].token_id == r.results[1].token_id
        assert (r.swap.num_swap_ins_hidden, r.swap.num_swap_ins_waited) == (0, 1)
        assert r.swap.num_offloaded_jobs == 0 and r.num_used_blocks == 4

        stream.step(swap_out=[pb.SwapOut(job_id=2)])
        stream.close()  # the worker frees the stream's jobs: device blocks and store blocks
        assert store_used_blocks(address) == 0
    finally:
        assert worker.terminate() == 0, worker.log()
        if kv is not None:
            kv.stop()
