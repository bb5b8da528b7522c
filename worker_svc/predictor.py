"""Output-length prediction from the model's own hidden state (TRAIL-style probe).

A small MLP reads the residual stream of one decoder layer at the token just sampled, plus the
prompt's length and the tokens generated so far, and predicts ``log(1 + remaining)``: the output
tokens still to come. It runs on the rows the engine samples anyway, at the prompt's end and
every ``refresh`` generated tokens after it, so a prediction is refined as decoding proceeds;
its cost is one ``[rows, features] x [features, hidden]`` product per such step.

The artifact is made offline per model by ``fastserve predictor train`` and cached beside the
model (``artifact_path``); ``features`` is shared with the trainer, so the probe sees what it
was trained on.

An answer that loops (``worker_svc.loops``: its last ``loop_ngram`` tokens occur earlier in
it) is predicted ``inf``, "to the cap", which the scheduler bounds by the job's own cap.

| artifact key      | meaning                                                       |
|-------------------|---------------------------------------------------------------|
| ``layer``         | decoder layer whose output is read (0-based)                  |
| ``hidden_size``   | the model's hidden size (checked at load)                     |
| ``refresh``       | predict at the first token and every ``refresh`` tokens after |
| ``mean``, ``std`` | feature standardization                                       |
| ``w1 b1 w2 b2``   | the MLP: ``gelu(f @ w1 + b1) @ w2 + b2``                      |
| ``info``          | how it was trained and its held-out error (for Describe/docs) |
"""

from __future__ import annotations

import hashlib
import math
import pathlib
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F

from worker_svc.loops import LOOP_NGRAM, loops

FORMAT = 1


def features(hidden: torch.Tensor, prompt_lens: Sequence[int],
             generated: Sequence[int]) -> torch.Tensor:
    """``[rows, hidden + 2]`` float32: the hidden state, log(1 + prompt length) and
    log(1 + tokens generated so far)."""
    extra = torch.tensor([[float(p), float(g)] for p, g in zip(prompt_lens, generated)],
                         dtype=torch.float32, device=hidden.device).log1p()
    return torch.cat([hidden.float(), extra], dim=1)


def wanted(num_generated: int, refresh: int) -> bool:
    """Whether a job that has just sampled its ``num_generated``-th token gets a prediction."""
    return (num_generated - 1) % refresh == 0


def artifact_path(model_path: str | pathlib.Path) -> pathlib.Path:
    """Where the predictor of the model at ``model_path`` is cached: keyed by the model's
    directory name and a digest of its config, so another model never reads it."""
    from fastserve.models import cache_dir

    model_path = pathlib.Path(model_path)
    config = model_path / "config.json"
    digest = hashlib.sha256(config.read_bytes() if config.is_file()
                            else str(model_path).encode()).hexdigest()[:12]
    return cache_dir() / "predictors" / f"{model_path.name}-{digest}.pt"


# Artifacts shipped with the package, by model directory name (the default model's, trained on
# the training split of ../shared/prompts: docs/benchmarks.md), used when none is cached.
PACKAGED = pathlib.Path(__file__).parent / "predictors"


def find_artifact(model_path: str | pathlib.Path) -> pathlib.Path | None:
    """The predictor for the model at ``model_path``: the one trained here (cached), else the
    one shipped for a model of that name, else None. Either is checked against the model's
    shape when loaded."""
    cached = artifact_path(model_path)
    if cached.is_file():
        return cached
    packaged = PACKAGED / f"{pathlib.Path(model_path).name}.pt"
    return packaged if packaged.is_file() else None


class LengthPredictor:
    """Predicts each sampled job's remaining output tokens (see the module doc)."""

    def __init__(self, artifact: dict[str, Any], hidden_size: int, num_layers: int,
                 device: torch.device | str = "cpu", loop_ngram: int = LOOP_NGRAM):
        if artifact.get("format") != FORMAT:
            raise ValueError(f"predictor artifact format {artifact.get('format')!r}; this "
                             f"worker reads format {FORMAT} (retrain: fastserve predictor train)")
        if artifact["hidden_size"] != hidden_size:
            raise ValueError(f"predictor was trained on hidden size {artifact['hidden_size']}, "
                             f"the model has {hidden_size}")
        layer = int(artifact["layer"])
        if not 0 <= layer < num_layers:
            raise ValueError(f"predictor reads layer {layer}; the model has {num_layers}")
        self.layer = layer
        self.layers: tuple[int, ...] = (layer,)
        self.refresh = int(artifact["refresh"])
        if loop_ngram < 0:
            raise ValueError(f"loop_ngram must be >= 0 (0: no loop check), got {loop_ngram}")
        self.loop_ngram = loop_ngram
        self.info = dict(artifact.get("info", {}))
        dev = torch.device(device)
        self._mean = artifact["mean"].to(dev, torch.float32)
        self._std = artifact["std"].to(dev, torch.float32)
        self._w1 = artifact["w1"].to(dev, torch.float32)
        self._b1 = artifact["b1"].to(dev, torch.float32)
        self._w2 = artifact["w2"].to(dev, torch.float32)
        self._b2 = artifact["b2"].to(dev, torch.float32)

    @classmethod
    def load(cls, path: str | pathlib.Path, hidden_size: int, num_layers: int,
             device: torch.device | str = "cpu", loop_ngram: int = LOOP_NGRAM
             ) -> LengthPredictor:
        artifact = torch.load(path, map_location="cpu", weights_only=True)
        return cls(artifact, hidden_size, num_layers, device, loop_ngram)

    def wants(self, num_generated: int) -> bool:
        return wanted(num_generated, self.refresh)

    def log_remaining(self, feats: torch.Tensor) -> torch.Tensor:
        """The MLP on standardized features: predicted ``log(1 + remaining)`` per row."""
        f = (feats - self._mean) / self._std
        return (F.gelu(f @ self._w1 + self._b1) @ self._w2 + self._b2).squeeze(1)

    def observe(self, hidden: dict[int, torch.Tensor], job_ids: Sequence[int],
                prompt_lens: Sequence[int], generated: Sequence[int],
                outputs: Sequence[Sequence[int]] | None = None) -> list[float]:
        """Predicted remaining output tokens for the rows of ``hidden[self.layer]``; ``inf``
        for a row whose output so far (``outputs``, when given) loops."""
        feats = features(hidden[self.layer], prompt_lens, generated)
        values: list[float] = torch.expm1(self.log_remaining(feats)).clamp_min(0.0).tolist()
        if outputs is None or not self.loop_ngram:
            return values
        n = self.loop_ngram
        return [math.inf if loops(out, n) else v for v, out in zip(values, outputs)]
