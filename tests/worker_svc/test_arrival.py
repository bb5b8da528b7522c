"""Output-length estimates at arrival (StepRequest.probes): a whole-prompt probe is the estimate
the job's first token brings, probes keep no KV and touch no job, invalid or failing probes
cost only their estimates, Describe says whether a worker answers them, and all of it over
real gRPC."""

from __future__ import annotations

import math
import random
from dataclasses import replace

import pytest
import torch
from engine_driver import DriverJob, drive
from test_engine_model_family import _mistral, _qwen2
from test_worker_server import BLOCK_SIZE, StepStream, Worker

from fastserve.predictor.collect import Recorder
from fastserve.proto import worker_pb2 as pb
from worker_svc import arrival
from worker_svc.engine import ArrivalProbe, JobCommand, NewJob, StepCommand
from worker_svc.loader import EngineConfig, load_engine
from worker_svc.model.llama import LlamaModel
from worker_svc.predictor import FORMAT, LengthPredictor
from worker_svc.sampler import SamplingParams

HIDDEN = 64  # tiny_llama_dir's hidden size
VOCAB = 256


def _artifact(layer=1, bias=3.0, seed=0):
    """A predictor whose output depends strongly on the hidden state (unit-scale weights)."""
    g = torch.Generator().manual_seed(seed)
    f = HIDDEN + 2
    return {"format": FORMAT, "hidden_size": HIDDEN, "layer": layer, "refresh": 4,
            "mean": torch.zeros(f), "std": torch.ones(f),
            "w1": torch.randn(f, 8, generator=g), "b1": torch.zeros(8),
            "w2": torch.randn(8, 1, generator=g) * 0.3, "b2": torch.tensor([bias]),
            "info": {}}


def _prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(VOCAB) for _ in range(n)]


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    e = load_engine(EngineConfig(model=str(tiny_llama_dir), num_blocks=128,
                                 predictor="none")).engine
    e.probe = LengthPredictor(_artifact(), HIDDEN, 2)
    yield e
    assert not e.jobs and e.pool.num_used_blocks == 0


def _start(engine, jobs):
    """Admit and prefill ``jobs`` (id -> prompt) with 8 blocks each from block 64 up; return
    each one's first-token estimate (predicted rest + 1)."""
    out = engine.step(StepCommand(
        new_jobs=[NewJob(j, p, SamplingParams(), list(range(64 + 8 * k, 72 + 8 * k)))
                  for k, (j, p) in enumerate(jobs.items())],
        commands=[JobCommand(j, len(p)) for j, p in jobs.items()]))
    assert not out.errors, out.errors
    return {r.job_id: r.predicted_remaining + 1 for r in out.results}


def test_a_whole_prompt_probe_is_the_estimate_its_first_token_brings(engine):
    running = {1: _prompt(9, 1), 2: _prompt(21, 2)}
    engine.step(StepCommand(
        new_jobs=[NewJob(j, p, SamplingParams(), list(range(8 * j, 8 * j + 8)))
                  for j, p in running.items()],
        commands=[JobCommand(j, len(p)) for j, p in running.items()]))
    prompts = {10: _prompt(5, 10), 11: _prompt(33, 11), 12: _prompt(100, 12), 13: [7]}
    # The probes in one Step with the running jobs' decodes, packed into one pass.
    out = engine.step(StepCommand(
        commands=[JobCommand(j, 1) for j in running],
        probes=[ArrivalProbe(j, p, len(p)) for j, p in prompts.items()]))
    assert not out.errors and [r.job_id for r in out.results] == [1, 2]
    assert all(r.token_id is not None for r in out.results) and out.compute_time_s > 0
    assert [e.job_id for e in out.estimates] == list(prompts)
    estimates = {e.job_id: e.predicted_output_tokens for e in out.estimates}
    assert len({round(v, 3) for v in estimates.values()}) == len(prompts)  # the hidden matters

    first = _start(engine, prompts)
    for j in prompts:
        assert estimates[j] == pytest.approx(first[j], rel=1e-4), j
    engine.step(StepCommand(free_job_ids=[*running, *prompts]))


def test_a_tail_is_read_as_a_prompt_of_its_own_with_the_whole_prompts_length(engine):
    whole = _prompt(60, 20)
    tail = whole[-16:]
    out = engine.step(StepCommand(probes=[
        ArrivalProbe(1, tail, len(whole)), ArrivalProbe(2, tail, len(tail)),
        ArrivalProbe(3, whole, len(whole))]))
    est = {e.job_id: e.predicted_output_tokens for e in out.estimates}
    assert len(est) == 3 and len(set(est.values())) == 3  # prompt_tokens is a feature
    # The tail alone at positions 0..15, with the whole prompt's length as its feature.
    hidden = engine.model.hidden_at(torch.tensor(tail), [len(tail)], 1)
    want = engine.probe.observe({1: hidden}, [1], [len(whole)], [1])[0] + 1
    assert est[1] == pytest.approx(want, rel=1e-5)
    assert est[2] == pytest.approx(_start(engine, {5: tail})[5], rel=1e-4)
    engine.step(StepCommand(free_job_ids=[5]))


def test_probes_keep_no_kv_and_leave_every_other_job_alone(engine):
    jobs = lambda: [DriverJob(i, _prompt(10 + 7 * i, 30 + i), 10, arrival=i,  # noqa: E731
                              sampling=SamplingParams(0.8, 0.9, 0, i)) for i in range(3)]
    plain = drive(engine, jobs(), chunk=8)
    step = engine.step
    seen = []

    def with_probes(cmd):
        out = step(replace(cmd, probes=[ArrivalProbe(100 + k, _prompt(5 + 9 * k, k), 40)
                                        for k in range(3)]))
        seen.append(len(out.estimates))
        return out

    engine.step = with_probes
    try:
        probed = drive(engine, jobs(), chunk=8)  # drive asserts no step errors
    finally:
        del engine.step
    assert probed == plain and seen and set(seen) == {3}

    # A Step of probes alone, beside a job holding KV: the pool's bytes and blocks unchanged.
    engine.step(StepCommand(new_jobs=[NewJob(7, _prompt(20, 7), SamplingParams(), [3, 4])],
                            commands=[JobCommand(7, 20)]))
    kv, used = engine.pool.data.clone(), engine.pool.num_used_blocks
    out = engine.step(StepCommand(probes=[ArrivalProbe(8, _prompt(30, 8), 30)]))
    assert len(out.estimates) == 1 and not out.results and not out.errors
    assert torch.equal(engine.pool.data, kv) and engine.pool.num_used_blocks == used == 2
    assert set(engine.jobs) == {7} and engine.jobs[7].num_computed == 20
    engine.step(StepCommand(free_job_ids=[7]))


def test_invalid_probes_are_skipped_and_disturb_nothing(engine, caplog):
    engine.step(StepCommand(new_jobs=[NewJob(1, _prompt(12, 1), SamplingParams(), [0])],
                            commands=[JobCommand(1, 12)]))
    limit = min(arrival.MAX_PROBE_TOKENS, engine.max_context)
    good = _prompt(6, 2)
    probes = [
        ArrivalProbe(10, [3, VOCAB, 4], 3),  # outside the vocabulary
        ArrivalProbe(11, [3, -1], 2),
        ArrivalProbe(12, [], 5),  # empty
        ArrivalProbe(13, good, 5),  # prompt_tokens smaller than the tail
        ArrivalProbe(14, good, engine.max_context),  # no room to generate
        ArrivalProbe(15, [1] * (limit + 1), engine.max_context - 1),  # too long
        ArrivalProbe(16, good, 6),
    ]
    with caplog.at_level("WARNING", logger="worker_svc.engine"):
        out = engine.step(StepCommand(commands=[JobCommand(1, 1)], probes=probes))
    assert not out.errors
    assert [r.job_id for r in out.results] == [1] and out.results[0].token_id is not None
    assert [e.job_id for e in out.estimates] == [16]
    skipped = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(skipped) == 6 and all(f"job {j} " in m for j, m in zip(range(10, 16), skipped))
    assert str(VOCAB) in skipped[0] and "empty" in skipped[2] and "less than" in skipped[3]
    engine.step(StepCommand(free_job_ids=[1]))


def test_a_failing_probe_costs_only_its_estimates(engine, monkeypatch):
    engine.step(StepCommand(new_jobs=[NewJob(1, _prompt(12, 1), SamplingParams(), [0])],
                            commands=[JobCommand(1, 12)]))

    def broken(*a, **k):
        raise RuntimeError("probe bug")

    monkeypatch.setattr(LlamaModel, "hidden_at", broken)
    out = engine.step(StepCommand(commands=[JobCommand(1, 1)],
                                  probes=[ArrivalProbe(5, [1, 2, 3], 3)]))
    assert not out.errors and not out.estimates
    assert [r.job_id for r in out.results] == [1] and out.results[0].token_id is not None
    monkeypatch.undo()
    # An estimate that is not a finite float32 (here infinite) is left out.
    probe = engine.probe
    engine.probe = LengthPredictor(_artifact(bias=200.0), HIDDEN, 2)
    try:
        out = engine.step(StepCommand(probes=[ArrivalProbe(5, [1, 2, 3], 3)]))
    finally:
        engine.probe = probe
    assert not out.estimates and not out.errors
    engine.step(StepCommand(free_job_ids=[1]))


@pytest.mark.parametrize("make", [None, _mistral, _qwen2], ids=["llama", "mistral", "qwen2"])
def test_hidden_at_is_what_the_prefill_probes_read(make, tiny_llama_dir, tmp_path):
    """Every layer, for prompts longer than Mistral's window (24) and with Qwen2's QKV bias,
    several segments packed: the residual stream ``meta.probes`` holds at the last token."""
    path = tiny_llama_dir
    if make is not None:
        torch.manual_seed(0)
        make().save_pretrained(tmp_path)
        path = tmp_path
    e = load_engine(EngineConfig(model=str(path), num_blocks=64, block_size=8,
                                 predictor="none")).engine
    seen = {}

    class Spy:
        layers = (0, 1)

        def wants(self, g):
            return True

        def observe(self, hidden, job_ids, prompt_lens, generated, outputs=None):
            seen.update({(j, layer): h[i] for layer, h in hidden.items()
                         for i, j in enumerate(job_ids)})
            return [None] * len(job_ids)

    e.probe = Spy()
    prompts = [_prompt(n, n) for n in (1, 17, 40)]
    prompts = [[t % e.vocab_size for t in p] for p in prompts]
    e.step(StepCommand(new_jobs=[NewJob(i, p, SamplingParams(), list(range(8 * i, 8 * i + 6)))
                                 for i, p in enumerate(prompts)],
                       commands=[JobCommand(i, len(p)) for i, p in enumerate(prompts)]))
    ids = torch.tensor([t for p in prompts for t in p])
    for layer in (0, 1):
        got = e.model.hidden_at(ids, [len(p) for p in prompts], layer)
        for i in range(len(prompts)):
            torch.testing.assert_close(got[i], seen[(i, layer)], rtol=1e-5, atol=1e-5)


def test_only_a_predictor_makes_a_worker_answer_probes(tiny_llama_dir, tmp_path):
    """Describe's ``arrival_probes`` is ``Engine.arrival_probes`` without pipeline stages (over
    gRPC: true in test_estimates_over_grpc, false in test_worker_server's test_describe)."""
    path = tmp_path / "p.pt"
    torch.save(_artifact(), path)
    loaded = load_engine(EngineConfig(model=str(tiny_llama_dir), num_blocks=16,
                                      predictor=str(path)))
    assert loaded.engine.arrival_probes
    loaded.engine.probe = Recorder((1,), 4)  # training data, not predictions
    assert not loaded.engine.arrival_probes
    plain = load_engine(EngineConfig(model=str(tiny_llama_dir), num_blocks=16,
                                     predictor="none")).engine
    assert not plain.arrival_probes
    # A worker without a predictor answers none, and runs the rest of the Step.
    plain.step(StepCommand(new_jobs=[NewJob(1, [5, 6], SamplingParams(), [0])]))
    out = plain.step(StepCommand(commands=[JobCommand(1, 2)],
                                 probes=[ArrivalProbe(2, [1, 2], 2)]))
    assert not out.estimates and not out.errors and [r.job_id for r in out.results] == [1]


def test_estimates_over_grpc(tiny_llama_dir, tmp_path):
    path = tmp_path / "p.pt"
    torch.save(_artifact(), path)
    (tmp_path / "cache").mkdir()
    worker = Worker(tiny_llama_dir, tmp_path / "cache", tmp_path / "worker.log",
                    "--predictor", str(path))
    try:
        assert worker.stub.Describe(pb.DescribeRequest(), timeout=10).arrival_probes
        stream = StepStream(worker.stub)
        prompt = _prompt(30, 3)
        r = stream.step(probes=[pb.ArrivalProbe(job_id=9, token_ids=prompt,
                                                prompt_tokens=len(prompt)),
                                pb.ArrivalProbe(job_id=8, token_ids=[VOCAB], prompt_tokens=1)])
        assert not r.errors and [e.job_id for e in r.estimates] == [9]
        assert r.compute_time_s > 0 and r.num_used_blocks == 0
        blocks = list(range(math.ceil(len(prompt) / BLOCK_SIZE)))
        first = stream.step(new_jobs=[pb.NewJob(job_id=9, prompt_token_ids=prompt,
                                                block_ids=blocks)],
                            commands=[pb.JobCommand(job_id=9, num_tokens=len(prompt))])
        assert r.estimates[0].predicted_output_tokens == pytest.approx(
            first.results[0].predicted_remaining_tokens + 1, rel=1e-4)
        stream.step(free_job_ids=[9])
        stream.close()
    finally:
        assert worker.terminate() == 0, worker.log()
