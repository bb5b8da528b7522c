"""Sampling is reproducible per job: a seed gives the same tokens whatever shares the batch."""

from __future__ import annotations

import random

import pytest
import torch
from engine_driver import DriverJob, drive

from worker_svc.loader import EngineConfig, load_engine
from worker_svc.sampler import SamplingParams, sample


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    return load_engine(EngineConfig(model=str(tiny_llama_dir), num_blocks=256)).engine


def _prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


SAMPLED = SamplingParams(temperature=1.3, top_p=0.95, top_k=100, seed=1234)


def test_same_seed_same_tokens_whatever_shares_the_batch(engine):
    alone = drive(engine, [DriverJob(0, _prompt(30, 0), 24, sampling=SAMPLED)])[0]
    others = [
        DriverJob(1, _prompt(5, 1), 10),
        DriverJob(2, _prompt(80, 2), 30, sampling=SamplingParams(temperature=0.7, seed=9)),
        DriverJob(3, _prompt(3, 3), 12, arrival=2, sampling=SamplingParams(temperature=1.0)),
    ]
    crowded = drive(engine, [DriverJob(0, _prompt(30, 0), 24, arrival=1, sampling=SAMPLED),
                             *others], chunk=16, seed=7)[0]
    assert crowded == alone
    greedy = drive(engine, [DriverJob(0, _prompt(30, 0), 24)])[0]
    assert alone != greedy, "temperature 1.3 should not reproduce the greedy sequence"


def test_different_seeds_differ(engine):
    a = drive(engine, [DriverJob(0, _prompt(30, 0), 24, sampling=SAMPLED)])[0]
    other = SamplingParams(temperature=1.3, top_p=0.95, top_k=100, seed=4321)
    b = drive(engine, [DriverJob(0, _prompt(30, 0), 24, sampling=other)])[0]
    assert a != b


def test_top_k_and_top_p_restrict_the_choice():
    logits = torch.tensor([[4.0, 3.0, 2.0, 1.0, 0.0, -1.0]])
    for step in range(200):
        (tok,), _, _ = sample(logits, [SamplingParams(temperature=5.0, top_k=2, seed=1)],
                              [step], [0])
        assert tok in (0, 1)
        # softmax of [4, 3, 2, ...]: p0 ~= 0.64 < 0.7, so top_p=0.7 keeps exactly tokens 0 and 1.
        (tok,), _, _ = sample(logits, [SamplingParams(temperature=1.0, top_p=0.7, seed=2)],
                           [step], [0])
        assert tok in (0, 1)


def test_logprob_is_the_model_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.5]])
    (tok,), (lp,), _ = sample(logits, [SamplingParams()], [0], [0])
    assert tok == 0
    assert lp == pytest.approx(torch.log_softmax(logits, -1)[0, 0].item(), abs=1e-6)


@pytest.mark.parametrize(
    "params, field",
    [
        (SamplingParams(temperature=-0.1), "temperature"),
        (SamplingParams(top_p=0.0), "top_p"),
        (SamplingParams(top_p=1.5), "top_p"),
        (SamplingParams(top_k=-1), "top_k"),
        (SamplingParams(top_k=10**6), "top_k"),
    ],
)
def test_bad_sampling_parameters_are_named(params, field):
    why = params.validate(vocab_size=256)
    assert why is not None and why.startswith(field)


def test_recompute_from_output_tokens_continues_the_same_draws(engine):
    """A job whose KV was lost is re-sent with its generated tokens; what follows is unchanged."""
    from worker_svc.engine import JobCommand, NewJob, StepCommand

    full = drive(engine, [DriverJob(0, _prompt(20, 5), 16, sampling=SAMPLED)])[0]
    prompt, done = _prompt(20, 5), full[:7]
    n = len(prompt) + len(done)
    out = engine.step(StepCommand(
        new_jobs=[NewJob(9, prompt, SAMPLED, list(range(3)), output_token_ids=done)],
        commands=[JobCommand(9, n)],
    ))
    assert not out.errors and out.results[0].token_id == full[7]
    rest = [out.results[0].token_id]
    for _ in range(16 - 8):
        out = engine.step(StepCommand(commands=[JobCommand(9, 1)]))
        rest.append(out.results[0].token_id)
    engine.step(StepCommand(free_job_ids=[9]))
    assert done + rest == full


def _reference_nucleus(row, p):
    """The whole-vocabulary sort the sampler used to make every draw."""
    row = row / p.temperature
    if p.top_k > 0:
        kth = torch.topk(row, p.top_k).values[-1]
        row = row.masked_fill(row < kth, float("-inf"))
    if p.top_p < 1.0:
        sorted_logits, order = torch.sort(row, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        drop = torch.zeros_like(probs, dtype=torch.bool).scatter(
            0, order, (probs.cumsum(-1) - probs) >= p.top_p)
        row = row.masked_fill(drop, float("-inf"))
    return torch.softmax(row, dim=-1)


@pytest.mark.parametrize("params", [
    SamplingParams(temperature=0.2, top_p=0.9), SamplingParams(temperature=1.0, top_p=0.95),
    SamplingParams(temperature=3.0, top_p=0.5), SamplingParams(temperature=0.7, top_k=40),
    SamplingParams(temperature=0.7, top_k=40, top_p=0.8), SamplingParams(temperature=1.0)])
def test_the_nucleus_is_what_a_whole_vocabulary_sort_keeps(params):
    from worker_svc.sampler import nucleus

    g = torch.Generator().manual_seed(0)
    for scale in (1.0, 4.0, 12.0):  # flat to peaked rows
        row = torch.randn(4000, generator=g) * scale
        ids, probs = nucleus(row, params)
        expect = _reference_nucleus(row, params)
        got = torch.zeros_like(expect).index_put_((ids,), probs)
        torch.testing.assert_close(got, expect, rtol=1e-4, atol=1e-6)
        (tok,), _, _ = sample(row.view(1, -1), [params], [3], [11])
        assert expect[tok] > 0


@pytest.mark.parametrize("top_p", [0.5, 0.9, 0.99])
def test_the_top_p_candidates_hold_the_nucleus(top_p):
    """Tokens under (1 - top_p) / vocabulary weigh less than 1 - top_p together, so the few
    tokens above it (all that is sorted) reach top_p: the whole row is never needed."""
    from worker_svc.sampler import _candidates

    g = torch.Generator().manual_seed(1)
    sizes = []
    for scale in (0.5, 1.0, 4.0, 12.0):
        for temperature in (0.2, 1.0, 2.0):
            full = torch.softmax(torch.randn(49152, generator=g) * scale / temperature, dim=-1)
            ids, probs = _candidates(full, top_p)
            assert probs.sum(dtype="float64") >= top_p
            assert (full[torch.from_numpy(ids)] == torch.from_numpy(probs)).all()
            sizes.append(len(ids))
    assert min(sizes) < 100  # peaked rows: a handful of candidates, not the vocabulary


def test_greedy_picks_the_first_highest_logit_as_torch_does():
    """Ties go to the lowest id and a NaN wins, as with ``torch.argmax`` (greedy parity)."""
    g = torch.Generator().manual_seed(3)
    for i in range(100):
        logits = torch.randint(-3, 3, (5, 300), generator=g).float()  # many ties
        if i % 5 == 0:
            logits[1, 17] = logits[1, 40] = float("nan")
        tokens, _, _ = sample(logits, [SamplingParams()] * 5, [0] * 5, [0] * 5)
        assert tokens == torch.argmax(logits, dim=-1).tolist()


def test_a_row_that_cannot_be_sampled_fails_its_job_alone(engine, monkeypatch):
    """Whatever makes one job's numbers unusable, its batch mates get their tokens."""
    import worker_svc.sampler as sampler
    from worker_svc.engine import NewJob, StepCommand
    from worker_svc.errors import ErrorCode

    def first_tokens(jobs):
        out = engine.step(StepCommand(new_jobs=[NewJob(i, p, s, list(range(4 * i, 4 * i + 4)))
                                                for i, (p, s) in jobs.items()],
                                      commands=[_cmd(i, len(p)) for i, (p, _) in jobs.items()]))
        engine.step(StepCommand(free_job_ids=list(jobs)))
        return out

    bad = SamplingParams(temperature=0.5, seed=3)
    good = SamplingParams(temperature=0.9, seed=4)
    alone = first_tokens({1: (_prompt(9, 1), good), 2: (_prompt(7, 2), SamplingParams())})
    real = sampler._sample_row

    def broken(row, p, gen):
        if p.temperature == 0.5:
            raise sampler.SamplingFailed("the distribution is not finite")
        return real(row, p, gen)

    monkeypatch.setattr(sampler, "_sample_row", broken)
    out = first_tokens({0: (_prompt(5, 0), bad), 1: (_prompt(9, 1), good),
                        2: (_prompt(7, 2), SamplingParams())})
    assert [(e.job_id, e.code) for e in out.errors] == [(0, ErrorCode.INVALID_ARGUMENT)]
    assert "not finite" in out.errors[0].message
    got = {r.job_id: r.token_id for r in out.results}
    assert got == {r.job_id: r.token_id for r in alone.results}
    assert engine.pool.num_used_blocks == 0


@pytest.mark.parametrize("top_p, top_k", [(1.0, 0), (0.9, 0), (0.9, 2)])
def test_the_sampler_reports_a_row_without_finite_mass_and_samples_the_rest(top_p, top_k):
    logits = torch.tensor([[float("nan")] * 4, [0.0, 5.0, 0.0, 0.0]])
    params = [SamplingParams(temperature=1.0, top_p=top_p, top_k=top_k, seed=1),
              SamplingParams(temperature=0.1, top_p=top_p, top_k=top_k, seed=1)]
    tokens, _, failed = sample(logits, params, [0, 0], [0, 0])
    assert list(failed) == [0] and "not finite" in failed[0]
    assert tokens[1] == 1


def test_a_vanishing_temperature_is_greedy():
    assert SamplingParams(temperature=1e-45).greedy and not SamplingParams(temperature=0.1).greedy


def _cmd(job_id, n):
    from worker_svc.engine import JobCommand

    return JobCommand(job_id, n, [])


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_min_tokens_keeps_eos_out_until_reached_and_logprobs_unmasked(temperature):
    logits = torch.full((3, 8), -5.0)
    logits[:, 2] = 10.0  # the end-of-sequence id is by far the likeliest in every row
    params = [SamplingParams(temperature, min_tokens=4, suppress=(2,), seed=1)] * 3
    tokens, lps, failed = sample(logits, params, [0, 3, 4], [1, 2, 3])
    assert not failed
    assert tokens[0] != 2 and tokens[1] != 2  # 0 and 3 tokens made: not yet
    assert tokens[2] == 2  # the fifth token may end it
    want = torch.log_softmax(logits, dim=-1)
    assert lps[0] == pytest.approx(want[0, tokens[0]].item())


def test_suppressed_ids_outside_the_vocabulary_are_named():
    assert "suppress_token_ids" in SamplingParams(min_tokens=1, suppress=(99,)).validate(8)
