"""Fitting the length probe: it learns a length that the features carry, chooses the layer
that carries it, is scored on held-out prompts only, and writes an artifact the worker's
predictor reads back to the same numbers."""

from __future__ import annotations

import math

import pytest
import torch

from fastserve.predictor import fit
from fastserve.predictor.split import held_out, split
from worker_svc.predictor import FORMAT, LengthPredictor, features

H = 16


def _data(num_prompts=120, seed=0):
    """Layer 3 carries each answer's log length in its first coordinate; layer 1 is noise."""
    g = torch.Generator().manual_seed(seed)
    feats = {1: [], 3: []}
    index, generated, remaining = [], [], []
    lengths = []
    for p in range(num_prompts):
        total = int(torch.randint(5, 300, (1,), generator=g))
        lengths.append(total)
        for gen in range(1, total + 1, 16):
            h = torch.randn(1, H, generator=g)
            signal = h.clone()
            signal[0, 0] = math.log1p(total - gen)
            feats[3].append(features(signal, [20], [gen])[0])
            feats[1].append(features(h, [20], [gen])[0])
            index.append(p)
            generated.append(gen)
            remaining.append(total - gen)
    return {"feats": {k: torch.stack(v) for k, v in feats.items()},
            "prompt_index": torch.tensor(index), "generated": torch.tensor(generated),
            "remaining": torch.tensor(remaining, dtype=torch.float32),
            "lengths": torch.tensor(lengths)}


def test_the_probe_learns_the_length_from_the_layer_that_carries_it():
    data = _data()
    train, test = list(range(96)), list(range(96, 120))
    result = fit.train(data, train, test, max_tokens=512, progress=False)
    assert result.layer == 3
    first = result.held_out["first_token"]
    assert first["rows"] == 24  # one first-token row per held-out prompt
    assert first["spearman"] > 0.9
    assert first["mae_tokens"] < 0.5 * first["baseline_mae_tokens"]
    assert result.validation["1"]["log_l1"] > result.validation["3"]["log_l1"]
    # The artifact reads back into the worker's predictor with the same predictions.
    artifact = {"format": FORMAT, "hidden_size": H, "refresh": 16, **result.weights}
    pred = LengthPredictor(artifact, H, 4)
    rows = data["prompt_index"] >= 96
    h = data["feats"][3][rows][:, :H]
    gen = data["generated"][rows].tolist()
    got = torch.tensor(pred.observe({3: h}, [0] * len(gen), [20] * len(gen), gen))
    clipped = torch.minimum(got, 512 - data["generated"][rows].float())
    mae = (clipped - data["remaining"][rows]).abs().mean().item()
    assert mae == pytest.approx(result.held_out["all_refreshes"]["mae_tokens"], rel=1e-4)


def test_the_split_is_fixed_by_each_instructions_text():
    texts = [f"instruction number {i}" for i in range(400)]
    train, test = split(texts, 0.2)
    assert sorted(train + test) == list(range(400)) and 50 < len(test) < 110
    # Reordering the file moves no instruction across the split.
    moved = split(texts[::-1], 0.2)[1]
    assert sorted(texts[::-1][i] for i in moved) == sorted(texts[i] for i in test)
    assert all(held_out(texts[i], 0.2) for i in test)
    with pytest.raises(ValueError, match="--holdout"):
        split(texts, 1.0)


def test_a_prompts_answers_stay_on_its_side_and_all_count_in_the_baseline():
    """Two answers per prompt (lengths [answer, prompt]): every held-out answer is scored,
    none of a training prompt's, and the baseline is the mean over all training answers."""
    one, two = _data(seed=0), _data(seed=1)
    data = {"feats": {k: torch.cat([one["feats"][k], two["feats"][k]]) for k in (1, 3)},
            **{k: torch.cat([one[k], two[k]]) for k in ("prompt_index", "generated",
                                                         "remaining")},
            "lengths": torch.stack([one["lengths"], two["lengths"]])}
    train, test = list(range(96)), list(range(96, 120))
    result = fit.train(data, train, test, max_tokens=512, progress=False)
    first = result.held_out["first_token"]
    assert first["rows"] == 48  # both answers of each of the 24 held-out prompts
    baseline = float(data["lengths"][:, :96].float().mean())
    t = data["remaining"][(data["prompt_index"] >= 96) & (data["generated"] == 1)]
    assert first["baseline_mae_tokens"] == pytest.approx(float(((baseline - 1) - t).abs().mean()),
                                                         rel=1e-5)
    assert first["spearman"] > 0.9
