"""Tensor parallelism's pieces without processes: the Megatron shards add up to the model,
ranks in threads (a stand-in group) follow rank 0 and generate what one engine does, and the
shared-memory all-reduce sums identically on every rank and gives up on a missing one, and
rank 0 of a real two-process group gives up on a follower that stops listening."""

from __future__ import annotations

import multiprocessing
import queue
import threading

import pytest
import torch
from engine_driver import DriverJob, drive

from fastserve.ports import free_port
from worker_svc.engine import Engine
from worker_svc.kv_pool import KVPool, KVPoolConfig
from worker_svc.loader import EngineConfig, load_engine
from worker_svc.model.config import ModelSpec, rope_tables
from worker_svc.model.llama import LlamaModel
from worker_svc.parallel.follower import follow
from worker_svc.parallel.group import GroupLayout, GroupLost, TensorGroup
from worker_svc.parallel.shard import check_tensor_parallel, shard_spec, shard_weights
from worker_svc.parallel.shm_reduce import ShmAllReduce


def _hf(path):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)


def test_a_group_size_must_divide_the_kv_heads_and_says_so(tiny_llama_dir):
    spec = ModelSpec.from_hf_config(_hf(tiny_llama_dir).config)  # 4 heads over 2 KV heads
    check_tensor_parallel(spec, 2)
    with pytest.raises(ValueError, match="tensor_parallel_size 3 must divide the model's 2 KV"):
        check_tensor_parallel(spec, 3)
    local = shard_spec(spec, 2)
    assert (local.num_heads, local.num_kv_heads, local.intermediate_size) == (2, 1, 64)


def test_the_shards_outputs_add_up_to_the_whole_layers(tiny_llama_dir):
    hf = _hf(tiny_llama_dir)
    spec = ModelSpec.from_hf_config(hf.config)
    full = hf.state_dict()
    shards = [shard_weights(full, spec, r, 2) for r in range(2)]
    x = torch.randn(5, spec.hidden_size)
    p = "model.layers.0."
    for name in ("self_attn.q_proj", "self_attn.k_proj", "mlp.gate_proj"):  # column parallel
        w = p + name + ".weight"
        parts = [x @ s[w].T for s in shards]
        torch.testing.assert_close(torch.cat(parts, -1), x @ full[w].T)
    for name in ("self_attn.o_proj", "mlp.down_proj"):  # row parallel: partial sums
        w = p + name + ".weight"
        inner = torch.randn(5, full[w].shape[1])
        n = inner.shape[1] // 2
        parts = [inner[:, r * n:(r + 1) * n] @ shards[r][w].T for r in range(2)]
        torch.testing.assert_close(parts[0] + parts[1], inner @ full[w].T)
    w = "model.embed_tokens.weight"
    assert all(s[w] is full[w] for s in shards)  # replicated, not copied


class ThreadGroup:
    """The TensorGroup interface for ranks that are threads of one process."""

    def __init__(self, size):
        self.size = size
        self.barrier = threading.Barrier(size, timeout=60)
        self.slots = [None] * size
        self.commands = [queue.Queue() for _ in range(size)]

    def member(self, rank):
        return _Member(self, rank)


class _Member:
    def __init__(self, group, rank):
        self.g, self.rank, self.size = group, rank, group.size
        self.reduces = 0

    def _gather(self, value):
        self.g.slots[self.rank] = value
        self.g.barrier.wait()
        out = list(self.g.slots)
        self.g.barrier.wait()
        return out

    def all_reduce(self, t):
        self.reduces += 1
        parts = self._gather(t.clone())
        total = parts[0].clone()
        for part in parts[1:]:
            total += part
        return t.copy_(total)

    def send_command(self, cmd):
        for q in self.g.commands[1:]:
            q.put(cmd)

    def receive_command(self):
        return self.g.commands[self.rank].get(timeout=60)

    def share_tokens(self, tokens):
        return list(self._gather(list(tokens))[0])

    def agree(self, state):
        if len(set(self._gather(state))) != 1:
            raise GroupLost("ranks disagree")


def _shard_engine(path, member, size, num_blocks=64):
    hf = _hf(path)
    full = ModelSpec.from_hf_config(hf.config)
    spec = shard_spec(full, size)
    weights = shard_weights(hf.state_dict(), full, member.rank, size)
    cos, sin = rope_tables(hf.config, full.max_position_embeddings, torch.device("cpu"))
    model = LlamaModel(spec, weights, cos, sin, linear_kernel="blas",
                       all_reduce=member.all_reduce)
    model.computes_logits = member.rank == 0
    pool = KVPool(KVPoolConfig(spec.num_layers, spec.num_kv_heads, spec.head_dim, num_blocks, 4),
                  torch.device("cpu"), torch.float32)
    return Engine(model, pool, None, group=member)


def _jobs():
    return [DriverJob(i, [3 + 5 * i + k for k in range(7 + 9 * i)], 12, arrival=i)
            for i in range(4)]


def test_ranks_in_threads_follow_rank_0_and_generate_what_one_engine_does(tiny_llama_dir):
    single = load_engine(EngineConfig(str(tiny_llama_dir), num_blocks=64, block_size=4,
                                      linear_kernel="blas")).engine
    want = drive(single, _jobs(), chunk=5)
    group = ThreadGroup(2)
    members = [group.member(r) for r in range(2)]
    engines = [_shard_engine(tiny_llama_dir, m, 2) for m in members]
    exit_code = []
    follower = threading.Thread(target=lambda: exit_code.append(follow(engines[1])))
    follower.start()
    got = drive(engines[0], _jobs(), chunk=5)
    members[0].send_command(None)
    follower.join(60)
    assert got == want
    assert exit_code == [0]
    assert members[1].reduces == members[0].reduces > 0  # two per layer per forward, in step
    assert engines[1].pool.num_used_blocks == engines[0].pool.num_used_blocks == 0
    assert engines[1].pool.config.num_kv_heads == 1  # its heads only


def test_arrival_probes_run_on_every_rank_and_rank_0_estimates(tiny_llama_dir):
    """Rank 0 alone holds the predictor; every rank runs the probes' forward (its
    all-reduces are collective), and the estimates are one engine's."""
    from dataclasses import replace

    from test_arrival import _artifact

    from worker_svc.engine import ArrivalProbe, StepCommand
    from worker_svc.predictor import LengthPredictor

    probes = [ArrivalProbe(50 + k, [(7 * k + 11 * i) % 256 for i in range(4 + 13 * k)], 60)
              for k in range(3)]
    single = load_engine(EngineConfig(str(tiny_llama_dir), num_blocks=64, block_size=4,
                                      linear_kernel="blas", predictor="none")).engine
    want_tokens = drive(single, _jobs(), chunk=5)
    single.probe = LengthPredictor(_artifact(), 64, 2)
    want = single.step(StepCommand(probes=probes)).estimates
    group = ThreadGroup(2)
    members = [group.member(r) for r in range(2)]
    engines = [_shard_engine(tiny_llama_dir, m, 2) for m in members]
    engines[0].probe = LengthPredictor(_artifact(), 64, 2)
    assert engines[0].arrival_probes and not engines[1].arrival_probes
    follower = threading.Thread(target=follow, args=(engines[1],))
    follower.start()
    try:
        before = members[0].reduces
        got = engines[0].step(StepCommand(probes=probes)).estimates
        # One pass through both layers (the predictor's is the last): two all-reduces each.
        assert members[0].reduces - before == 4
        step = engines[0].step
        seen = []

        def with_probes(cmd):
            seen.append(step(replace(cmd, probes=probes)))
            return seen[-1]

        engines[0].step = with_probes
        tokens = drive(engines[0], _jobs(), chunk=5)
    finally:
        members[0].send_command(None)
        follower.join(60)
    assert [e.job_id for e in got] == [p.job_id for p in probes]
    for g, w in zip(got, want, strict=True):
        assert g.predicted_output_tokens == pytest.approx(w.predicted_output_tokens, rel=1e-4)
    assert tokens == want_tokens and all(len(o.estimates) == 3 for o in seen)
    assert members[1].reduces == members[0].reduces
    assert engines[1].pool.num_used_blocks == 0


def _shm_rank(rank, size, name_q, out_q, value):
    shm = ShmAllReduce(rank, size, 10.0, None if rank == 0 else name_q.get())
    if rank == 0:
        for _ in range(size - 1):
            name_q.put(shm.name)
    sums = []
    for k in range(50):  # many in a row: the two buffers alternate under the ranks
        t = torch.full((1000,), value * (k + 1), dtype=torch.float32)
        t[rank] += 0.1
        sums.append(shm.all_reduce(t).clone())
    out_q.put((rank, torch.stack(sums).tolist()))  # plain lists: the process exits next
    if rank == 0:
        shm.unlink()


def test_the_shared_memory_all_reduce_sums_identically_on_every_rank():
    ctx = multiprocessing.get_context("spawn")
    name_q, out_q = ctx.Queue(), ctx.Queue()
    values = [1.0, 2.5, -0.75]
    procs = [ctx.Process(target=_shm_rank, args=(r, 3, name_q, out_q, values[r]))
             for r in range(3)]
    for p in procs:
        p.start()
    results = {r: torch.tensor(v) for r, v in (out_q.get(timeout=120) for _ in procs)}
    for p in procs:
        p.join(30)
    assert torch.equal(results[0], results[1]) and torch.equal(results[1], results[2])
    expected = sum(values) * torch.arange(1, 51, dtype=torch.float32)
    torch.testing.assert_close(results[0][:, 5], expected)
    torch.testing.assert_close(results[0][:, 0], expected + 0.1)


def test_the_shared_memory_all_reduce_gives_up_on_a_rank_that_never_comes():
    shm = ShmAllReduce(0, 2, 0.3)
    try:
        with pytest.raises(TimeoutError, match="did not reach all-reduce 1"):
            shm.all_reduce(torch.ones(4))
    finally:
        shm.unlink()


def _command_rank(rank, address, out_q, resume):
    group = TensorGroup(GroupLayout(rank=rank, size=2, address=address, timeout_s=1.0),
                        torch.device("cpu"))
    commands = [{"step": 1, "free": [3, 4]}, "x" * 100_000, None]
    if rank == 1:
        out_q.put(("follower", [group.receive_command() for _ in commands]))
        # Stop listening, as a follower cut off from rank 0 does, until rank 0 has given up:
        # 10x the group timeout, well short of the 24 s a follower waits for a command.
        out_q.put(("resumed", resume.wait(10)))
        return
    for cmd in commands:
        group.send_command(cmd)
    try:
        group.send_command({"step": 2})
        out_q.put(("leader", "sent to a follower that was not listening"))
    except GroupLost as e:
        out_q.put(("leader", str(e)))
    resume.set()


def test_rank_0_gives_up_on_a_follower_that_stops_listening_within_the_group_timeout():
    """A gloo send finishes only once the receiver posts its receive: rank 0 must not wait the
    followers' long command wait (24 s) for a follower that will never listen again."""
    address = f"127.0.0.1:{free_port()}"
    ctx = multiprocessing.get_context("spawn")
    out_q, resume = ctx.Queue(), ctx.Event()
    procs = [ctx.Process(target=_command_rank, args=(r, address, out_q, resume))
             for r in range(2)]
    for p in procs:
        p.start()
    try:
        got = dict(out_q.get(timeout=120) for _ in range(3))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
    assert got["follower"] == [{"step": 1, "free": [3, 4]}, "x" * 100_000, None]
    assert "command broadcast failed" in got["leader"], got["leader"]
    assert got["resumed"] is True, "rank 0 waited for the follower instead of giving up"
