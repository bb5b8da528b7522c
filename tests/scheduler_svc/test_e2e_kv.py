"""KV offload and upload through a real KV store, worker and scheduler (separate processes).

A device pool far too small for the requests in flight forces the skip-join MLFQ to offload
and upload jobs over and over; greedy output must match each request run alone, and every
block on the device and in the store must be free at the end. Killing the store mid-run must
only cost recomputation.
"""

from __future__ import annotations

import threading
import time

import grpc
import pytest
from procs import free_port, scrape_metrics, start_kvstore, start_scheduler, start_worker

from fastserve.proto import scheduler_pb2 as spb
from fastserve.proto import scheduler_pb2_grpc

MAX_TOKENS = 48


def prompts(n):
    return [[100 + 7 * i + k for k in range(40 + 3 * i)] for i in range(n)]


def generate(stub, ids, request_id=""):
    req = spb.GenerateRequest(
        token_ids=spb.TokenIds(ids=ids), request_id=request_id,
        sampling=spb.SamplingOptions(max_tokens=MAX_TOKENS, temperature=0.0, ignore_eos=True))
    out, final = [], None
    for msg in stub.Generate(req, timeout=300):
        if msg.HasField("chunk"):
            out += list(msg.chunk.token_ids)
        else:
            final = msg.final
    assert final is not None and final.finish_reason == spb.FINISH_REASON_LENGTH, final
    return out


def wait_for(pred, timeout_s=10.0):
    """The worker frees store handles right after each copy: give it a moment."""
    deadline = time.monotonic() + timeout_s
    while not pred():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def concurrently(stub, batch):
    results: dict[int, list[int] | Exception] = {}

    def run(i, ids):
        try:
            results[i] = generate(stub, ids, f"r{i}")
        except Exception as e:  # noqa: BLE001 - handed to the test
            results[i] = e

    threads = [threading.Thread(target=run, args=(i, ids)) for i, ids in enumerate(batch)]
    for t in threads:
        t.start()
        time.sleep(0.01)  # staggered arrivals: new jobs overtake paused ones
    for t in threads:
        t.join(300)
    return [results[i] for i in range(len(batch))]


class KVCluster:
    def __init__(self, model, logs, kv_policy, store_address, *scheduler_args,
                 policy="skip-join-mlfq", num_blocks=20):
        self.logs = logs
        self.store_address = store_address
        self.store = start_kvstore(logs, 64 << 20, "--listen", store_address)
        self.worker = start_worker(str(model), logs, num_blocks, "worker", "--block-size", "8",
                                   "--kvstore", store_address)
        self.metrics_port = free_port()
        self.scheduler = start_scheduler(
            str(model), [self.worker.address], logs, "--policy", policy,
            "--kv-policy", kv_policy, "--max-batch-size", "2", "--starve-limit", "0.3",
            "--metrics-port", str(self.metrics_port), *scheduler_args)
        self.channel = grpc.insecure_channel(self.scheduler.address)
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)

    def store_used_blocks(self):
        """Blocks in use as the store itself counts them (not the scheduler's accounting)."""
        from fastserve.proto import kvstore_pb2, kvstore_pb2_grpc

        with grpc.insecure_channel(self.store_address) as ch:
            stats = kvstore_pb2_grpc.KVStoreStub(ch).Stats(kvstore_pb2.StatsRequest(),
                                                           timeout=10)
        return stats.used_blocks

    def metric(self, name):
        return sum(v for (n, _), v in scrape_metrics(self.metrics_port).items() if n == name)

    def close(self):
        self.channel.close()
        self.scheduler.stop()
        self.worker.stop()
        self.store.stop()


@pytest.fixture(params=["proactive", "reactive"])
def kv_cluster(request, tiny_tok_model, tmp_path):
    cluster = KVCluster(tiny_tok_model, tmp_path, request.param, f"127.0.0.1:{free_port()}")
    yield cluster
    cluster.close()


def test_heavy_swapping_keeps_greedy_output_and_frees_everything(kv_cluster):
    batch = prompts(6)  # 88-103 tokens each: 11-13 blocks of 8; the pool has 20
    alone = [generate(kv_cluster.stub, ids) for ids in batch]
    before = kv_cluster.metric("fastserve:kv_swap_outs_total")
    together = concurrently(kv_cluster.stub, batch)
    assert together == alone
    swaps = kv_cluster.metric("fastserve:kv_swap_outs_total") - before
    assert swaps >= 3, f"only {swaps} offloads: the test did not put the pool under pressure"
    assert kv_cluster.metric("fastserve:kv_swap_ins_total") >= swaps
    assert kv_cluster.metric("fastserve:kv_lost_total") == 0
    assert kv_cluster.metric("fastserve:kv_store_blocks_used") == 0
    assert kv_cluster.metric("fastserve:kv_blocks_used") == 0
    assert wait_for(lambda: kv_cluster.store_used_blocks() == 0)

    # Cancelled while paused, offloaded or uploading: nothing stays behind either.
    streams = []
    for i, ids in enumerate(batch):
        req = spb.GenerateRequest(
            token_ids=spb.TokenIds(ids=ids), request_id=f"c{i}",
            sampling=spb.SamplingOptions(max_tokens=100, temperature=0.0, ignore_eos=True))
        streams.append(kv_cluster.stub.Generate(req, timeout=120))
    before = kv_cluster.metric("fastserve:kv_swap_outs_total")
    assert wait_for(lambda: kv_cluster.metric("fastserve:kv_swap_outs_total") >= before + 3,
                    timeout_s=30)
    for stream in streams:
        stream.cancel()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and (
            kv_cluster.metric("fastserve:kv_store_blocks_used")
            or kv_cluster.metric("fastserve:kv_blocks_used")
            or kv_cluster.metric("fastserve:num_requests_running")):
        time.sleep(0.1)
    assert kv_cluster.metric("fastserve:kv_store_blocks_used") == 0
    assert kv_cluster.metric("fastserve:kv_blocks_used") == 0
    assert kv_cluster.metric("fastserve:num_requests_offloaded") == 0
    assert wait_for(lambda: kv_cluster.store_used_blocks() == 0)


def test_store_killed_mid_run_jobs_are_recomputed_then_store_reused(tiny_tok_model, tmp_path):
    cluster = KVCluster(tiny_tok_model, tmp_path, "proactive", f"127.0.0.1:{free_port()}")
    try:
        batch = prompts(6)
        alone = [generate(cluster.stub, ids) for ids in batch]
        results = {}
        runner = threading.Thread(target=lambda: results.update(
            enumerate(concurrently(cluster.stub, batch))))
        runner.start()
        deadline = time.monotonic() + 60
        while (cluster.metric("fastserve:kv_swap_outs_total") < 2
               and time.monotonic() < deadline):
            time.sleep(0.02)
        cluster.store.kill()
        runner.join(300)
        assert [results[i] for i in range(len(batch))] == alone
        # The store comes back on its address; the worker registers again and swaps resume.
        cluster.store = start_kvstore(tmp_path, 64 << 20, "--listen", cluster.store_address,
                                      name="kvstore-again")
        lost = cluster.metric("fastserve:kv_lost_total")
        before = cluster.metric("fastserve:kv_swap_outs_total")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            assert concurrently(cluster.stub, batch) == alone
            if cluster.metric("fastserve:kv_swap_ins_total") and (
                    cluster.metric("fastserve:kv_swap_outs_total") > before
                    and cluster.metric("fastserve:kv_lost_total") == lost):
                break
        else:
            pytest.fail("no successful swap after the store restarted")
        assert cluster.metric("fastserve:kv_blocks_used") == 0
    finally:
        cluster.close()


@pytest.mark.parametrize("ratio, displaced", [(8.0, True), (0.0, False)])
def test_a_short_arrival_offloads_the_running_long_job_under_the_oracle(
        tiny_tok_model, tmp_path, ratio, displaced):
    """srpt-oracle, a real worker and store, 64 blocks of 8, a batch with a free slot: a long
    job (200-token prompt, 280 tokens) runs alone on 25-60 blocks; a short one (320-token
    prompt, 2 tokens: 41 blocks, so it never fits beside the long one) arrives once the long
    one streams. With ``--displace-running-ratio 8`` it offloads the running job (over 16
    tokens left against 2) and finishes first; at 0 it waits for the long job to finish.
    Either way both answers are token for token the ones each gives alone, and every block is
    free at the end."""
    cluster = KVCluster(tiny_tok_model, tmp_path, "proactive", f"127.0.0.1:{free_port()}",
                        "--displace-running-ratio", str(ratio), policy="srpt-oracle",
                        num_blocks=64)
    long_ids = [100 + k for k in range(200)]
    short_ids = [400 + k for k in range(320)]

    def request(ids, max_tokens, rid):
        return spb.GenerateRequest(
            token_ids=spb.TokenIds(ids=ids), request_id=rid,
            sampling=spb.SamplingOptions(max_tokens=max_tokens, temperature=0.0,
                                         ignore_eos=True))

    def run(req, out, done):
        for msg in cluster.stub.Generate(req, timeout=120):
            if msg.HasField("chunk"):
                out.extend(msg.chunk.token_ids)
        done.append(req.request_id)

    try:
        alone = {}
        for ids, n, rid in ((long_ids, 280, "long"), (short_ids, 2, "short")):
            out: list[int] = []
            run(request(ids, n, rid), out, [])
            alone[rid] = out
        before = cluster.metric("fastserve:kv_swap_outs_total")
        done: list[str] = []
        got: dict[str, list[int]] = {"long": [], "short": []}
        first = threading.Thread(target=run, args=(request(long_ids, 280, "long"),
                                                   got["long"], done))
        first.start()
        assert wait_for(lambda: len(got["long"]) >= 1, timeout_s=60)
        assert len(got["long"]) <= 280 - 8 * 2  # still 8x the short job's work left
        run(request(short_ids, 2, "short"), got["short"], done)
        first.join(120)
        assert got == alone
        swaps = cluster.metric("fastserve:kv_swap_outs_total") - before
        assert (swaps >= 1) is displaced, swaps
        assert done == (["short", "long"] if displaced else ["long", "short"])
        assert wait_for(lambda: cluster.metric("fastserve:kv_blocks_used") == 0
                        and cluster.store_used_blocks() == 0)
    finally:
        cluster.close()
