"""The output-length probe on the engine: predictions at the first token and every refresh,
the probe never changes tokens, a broken probe costs only predictions, and artifacts load
(or are refused) clearly."""

from __future__ import annotations

import random

import pytest
import torch
from engine_driver import DriverJob, drive

from fastserve.predictor.collect import collect
from worker_svc.engine import JobCommand, NewJob, StepCommand
from worker_svc.loader import EngineConfig, load_engine, load_predictor
from worker_svc.predictor import FORMAT, LengthPredictor, features
from worker_svc.sampler import SamplingParams

HIDDEN = 64  # tiny_llama_dir's hidden size


def _artifact(layer=1, refresh=4, bias=3.0, seed=0, hidden=HIDDEN):
    g = torch.Generator().manual_seed(seed)
    f = hidden + 2
    return {"format": FORMAT, "hidden_size": hidden, "layer": layer, "refresh": refresh,
            "mean": torch.zeros(f), "std": torch.ones(f),
            "w1": torch.randn(f, 8, generator=g) * 0.01, "b1": torch.zeros(8),
            "w2": torch.randn(8, 1, generator=g) * 0.01, "b2": torch.tensor([bias]),
            "info": {"held_out": {"first_token": {"mae_tokens": 12.0, "spearman": 0.5}}}}


@pytest.fixture(scope="module")
def engine(tiny_llama_dir):
    return load_engine(EngineConfig(model=str(tiny_llama_dir), num_blocks=256,
                                    predictor="none")).engine


def _prompt(n, seed):
    rng = random.Random(seed)
    return [rng.randrange(256) for _ in range(n)]


def _run(engine, prompt, steps):
    """One job: prefill then ``steps - 1`` decodes; the results of every step."""
    blocks = list(range(8))
    out = [engine.step(StepCommand(new_jobs=[NewJob(7, prompt, SamplingParams(), blocks)],
                                   commands=[JobCommand(7, len(prompt))]))]
    for _ in range(steps - 1):
        out.append(engine.step(StepCommand(commands=[JobCommand(7, 1)])))
    engine.step(StepCommand(free_job_ids=[7]))
    return [o.results[0] for o in out]


def test_predictions_at_the_first_token_and_every_refresh(engine):
    engine.probe = LengthPredictor(_artifact(refresh=4), HIDDEN, 2)
    try:
        results = _run(engine, _prompt(20, 0), 10)
    finally:
        engine.probe = None
    have = [i + 1 for i, r in enumerate(results) if r.predicted_remaining is not None]
    assert have == [1, 5, 9]  # tokens generated when predicted
    # The MLP's bias dominates: log(1 + remaining) ~ 3.
    assert all(15 < results[g - 1].predicted_remaining < 25 for g in have)


def test_the_probe_never_changes_tokens_and_a_broken_one_costs_only_predictions(engine):
    jobs = lambda: [DriverJob(i, _prompt(10 + 7 * i, i), 12,  # noqa: E731
                              sampling=SamplingParams(0.8, 0.9, 0, i)) for i in range(3)]
    plain = drive(engine, jobs(), chunk=8)
    engine.probe = LengthPredictor(_artifact(refresh=1), HIDDEN, 2)
    try:
        probed = drive(engine, jobs(), chunk=8)

        class Broken:
            layers = (0,)

            def wants(self, g):
                return True

            def observe(self, *a):
                raise RuntimeError("probe bug")

        engine.probe = Broken()
        broken = drive(engine, jobs(), chunk=8)  # drive asserts no step errors
    finally:
        engine.probe = None
    assert probed == plain == broken


def test_probe_reads_the_residual_stream_of_its_layer(engine):
    """The probed hidden state is the layer's output at the sampled row: a predictor whose
    first layer is the identity on the features sees exactly ``features(h, ...)``."""
    seen = {}

    class Spy:
        layers = (0, 1)

        def wants(self, g):
            return True

        def observe(self, hidden, job_ids, prompt_lens, generated, outputs=None):
            seen.update(hidden=hidden, lens=list(prompt_lens), gen=list(generated))
            return [None] * len(job_ids)

    engine.probe = Spy()
    try:
        results = _run(engine, _prompt(12, 3), 1)
    finally:
        engine.probe = None
    assert results[0].predicted_remaining is None
    assert set(seen["hidden"]) == {0, 1} and seen["hidden"][0].shape == (1, HIDDEN)
    assert seen["lens"] == [12] and seen["gen"] == [1]
    assert not torch.equal(seen["hidden"][0], seen["hidden"][1])
    f = features(seen["hidden"][1], [12], [1])
    assert f.shape == (1, HIDDEN + 2)
    assert f[0, -2].item() == pytest.approx(torch.log1p(torch.tensor(12.0)).item())


def test_artifacts_load_or_are_refused_clearly(tmp_path, tiny_llama_dir):
    path = tmp_path / "p.pt"
    torch.save(_artifact(), path)
    cfg = EngineConfig(model=str(tiny_llama_dir), predictor=str(path))
    loaded = load_engine(cfg)
    assert isinstance(loaded.engine.probe, LengthPredictor)
    assert "layer 1" in loaded.predictor and "MAE 12 tokens" in loaded.predictor
    with pytest.raises(ValueError, match="hidden size 32"):
        LengthPredictor(_artifact(hidden=32), HIDDEN, 2)
    with pytest.raises(ValueError, match="layer 5"):
        LengthPredictor(_artifact(layer=5), HIDDEN, 2)
    with pytest.raises(ValueError, match="does not exist"):
        load_predictor(EngineConfig(model="x", predictor=str(tmp_path / "missing.pt")),
                       str(tiny_llama_dir), loaded.spec, torch.device("cpu"))
    assert load_engine(EngineConfig(model=str(tiny_llama_dir))).engine.probe is None  # auto


def test_collect_labels_each_sample_with_the_tokens_still_to_come(engine):
    prompts = [_prompt(9 + i, 10 + i) for i in range(5)]
    sampling = [SamplingParams(1.0, 1.0, 0, i) for i in range(5)]
    samples, lengths = collect(engine, prompts, eos={1, 2, 3}, max_tokens=20,
                               sampling=sampling, batch_size=3, layers=(0, 1), refresh=4,
                               progress=False)
    assert engine.probe is None and not engine.jobs and engine.pool.num_used_blocks == 0
    feats, index, generated, remaining = samples.tensors()
    assert feats[0].shape == feats[1].shape == (len(index), HIDDEN + 2)
    for p in range(5):
        rows = index == p
        g = generated[rows].tolist()
        assert g == list(range(1, lengths[p] + 1, 4))  # the first token, then every 4
        assert remaining[rows].tolist() == [lengths[p] - x for x in g]
    assert all(1 <= n <= 20 for n in lengths)


def test_a_predictor_trained_here_wins_over_the_shipped_one(tmp_path, monkeypatch):
    from worker_svc import predictor

    model = tmp_path / "models" / "SomeModel"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    monkeypatch.setenv("FASTSERVE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(predictor, "PACKAGED", tmp_path / "shipped")
    assert predictor.find_artifact(model) is None
    (tmp_path / "shipped").mkdir()
    torch.save(_artifact(), tmp_path / "shipped" / "SomeModel.pt")
    assert predictor.find_artifact(model) == tmp_path / "shipped" / "SomeModel.pt"
    cached = predictor.artifact_path(model)
    cached.parent.mkdir(parents=True)
    torch.save(_artifact(), cached)
    assert predictor.find_artifact(model) == cached


def test_the_shipped_predictor_fits_the_default_model(default_model_dir):
    from transformers import AutoConfig

    from worker_svc.model.config import ModelSpec
    from worker_svc.predictor import PACKAGED

    spec = ModelSpec.from_hf_config(AutoConfig.from_pretrained(default_model_dir), None)
    p = LengthPredictor.load(PACKAGED / f"{default_model_dir.name}.pt", spec.hidden_size,
                             spec.num_layers)
    held = p.info["held_out"]["first_token"]
    assert held["mae_tokens"] < held["baseline_mae_tokens"] and held["spearman"] > 0.3


def test_several_answers_per_prompt_are_labelled_with_their_prompt(engine):
    from fastserve.predictor.collect import answer_sampling, collect_answers

    prompts = [_prompt(9 + i, 20 + i) for i in range(3)]
    kwargs = {"eos": {1, 2, 3}, "max_tokens": 20, "batch_size": 1, "layers": (1,),
              "refresh": 4, "progress": False}
    samples, lengths = collect_answers(engine, prompts,
                                       sampling=answer_sampling(3, 2, 1.0, 1.0, 5), **kwargs)
    assert len(lengths) == 2 and all(len(row) == 3 for row in lengths)
    _, index, generated, remaining = samples.tensors()
    assert sorted(set(index.tolist())) == [0, 1, 2]  # prompts, not answers
    for p in range(3):
        first = remaining[(index == p) & (generated == 1)]
        assert sorted(first.tolist()) == sorted([lengths[0][p] - 1, lengths[1][p] - 1])
    # Answer k of a prompt is the one a single sample with seed + k gives.
    for k in (0, 1):
        _, alone = collect(engine, prompts, sampling=answer_sampling(3, 1, 1.0, 1.0, 5 + k),
                           **kwargs)
        assert alone == lengths[k]
    assert lengths[0] != lengths[1]  # the seeds differ, and so do the answers
    for wrong in (answer_sampling(3, 2, 1.0, 1.0, 5)[:5], []):  # not a whole number per prompt
        with pytest.raises(ValueError, match="one sampling per answer"):
            collect_answers(engine, prompts, sampling=wrong, **kwargs)


def test_an_answer_that_loops_is_predicted_to_run_to_its_cap(engine):
    """The engine hands the probe each row's output so far; a row whose last ``loop_ngram``
    tokens came before is predicted ``inf`` (the scheduler bounds it by the cap), the others
    the MLP's value; ``loop_ngram`` 0 never flags."""
    seen = []

    class Spy:
        layers = (1,)

        def wants(self, g):
            return True

        def observe(self, hidden, job_ids, prompt_lens, generated, outputs=None):
            seen.append([list(o) for o in outputs])
            return [None] * len(job_ids)

    engine.probe = Spy()
    try:
        results = _run(engine, _prompt(12, 5), 6)
    finally:
        engine.probe = None
    tokens = [r.token_id for r in results]
    assert seen == [[tokens[:g]] for g in range(1, 7)]  # what it had made when sampled

    p = LengthPredictor(_artifact(refresh=1), HIDDEN, 2, loop_ngram=3)
    hidden = {1: torch.zeros(3, HIDDEN)}
    outputs = [[4, 8, 15, 16], [4, 8, 15, 4, 8, 15], [9, 9, 9, 9]]
    plain = p.observe(hidden, [0, 1, 2], [5, 5, 5], [4, 6, 4])  # no outputs: the MLP alone
    assert all(15 < v < 25 for v in plain)
    assert p.observe(hidden, [0, 1, 2], [5, 5, 5], [4, 6, 4], outputs) == [
        plain[0], float("inf"), float("inf")]
    off = LengthPredictor(_artifact(refresh=1), HIDDEN, 2, loop_ngram=0)
    assert off.observe(hidden, [0, 1, 2], [5, 5, 5], [4, 6, 4], outputs) == plain
    with pytest.raises(ValueError, match="loop_ngram"):
        LengthPredictor(_artifact(), HIDDEN, 2, loop_ngram=-1)
