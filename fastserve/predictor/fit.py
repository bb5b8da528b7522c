"""Fit the length probe on recorded generations and measure it on held-out prompts.

The probe is a one-hidden-layer MLP (``worker_svc.predictor``) regressing ``log(1 +
remaining)`` with a squared loss, trained full-batch with AdamW, weight decay and dropout on
its input and hidden units (a few hundred answers for 578 features: without dropout the best
validation epoch was the 10th, first-token Spearman 0.25-0.29 against 0.43-0.45 with it).
One is fitted per candidate layer on most of the training prompts and scored on the rest (the
validation prompts, split by prompt, never by row: rows of one answer are alike); the layer
with the lowest validation error is refitted on every training prompt, for the epochs
validation chose, and scored once on the held-out prompts.

Figures, each at the first output token (a prediction of the whole output, what the
scheduler first ranks by) and over every refresh point (the remaining length as decoding
proceeds): mean absolute error in tokens, Spearman rank correlation, and the mean absolute
error of always predicting the training prompts' mean (the baseline the probe must beat).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from fastserve.predictor.rank import spearman

HIDDEN = 64
MAX_EPOCHS = 1000
LR = 1e-3
WEIGHT_DECAY = 0.1
DROPOUT = 0.4


@dataclass
class Result:
    layer: int
    weights: dict[str, Any]
    validation: dict[str, dict[str, float]]
    held_out: dict[str, dict[str, float]]


class _Mlp(torch.nn.Module):
    def __init__(self, mean: torch.Tensor, std: torch.Tensor):
        super().__init__()
        self.register_buffer("mean", mean)
        self.register_buffer("std", std)
        self.l1 = torch.nn.Linear(mean.numel(), HIDDEN)
        self.l2 = torch.nn.Linear(HIDDEN, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = F.gelu(self.l1(F.dropout((x - self.mean) / self.std, DROPOUT, self.training)))
        return self.l2(F.dropout(h, DROPOUT, self.training)).squeeze(1)

    def weights(self) -> dict[str, torch.Tensor]:
        return {"mean": self.mean.clone(), "std": self.std.clone(),
                "w1": self.l1.weight.detach().t().contiguous(),
                "b1": self.l1.bias.detach().clone(),
                "w2": self.l2.weight.detach().t().contiguous(),
                "b2": self.l2.bias.detach().clone()}


def _fit(x: torch.Tensor, y: torch.Tensor, epochs: int, val: tuple[torch.Tensor, torch.Tensor]
         | None = None, seed: int = 0) -> tuple[_Mlp, int, float]:
    """Train on (x, y); with ``val``, keep the epoch of lowest validation loss."""
    torch.manual_seed(seed)
    mlp = _Mlp(x.mean(0), x.std(0).clamp_min(1e-6))
    with torch.no_grad():
        mlp.l2.bias.fill_(float(y.mean()))
    opt = torch.optim.AdamW(mlp.parameters(), lr=LR, weight_decay=WEIGHT_DECAY)
    best, best_epoch, best_state = float("inf"), epochs, None
    for epoch in range(1, epochs + 1):
        opt.zero_grad()
        loss = F.mse_loss(mlp(x), y)
        loss.backward()
        opt.step()
        if val is not None and epoch % 10 == 0:
            mlp.eval()
            with torch.no_grad():
                v = F.l1_loss(mlp(val[0]), val[1]).item()
            mlp.train()
            if v < best:
                best, best_epoch = v, epoch
                best_state = {k: t.clone() for k, t in mlp.state_dict().items()}
    if best_state is not None:
        mlp.load_state_dict(best_state)
    mlp.eval()
    return mlp, best_epoch, best


def _scores(pred_remaining: torch.Tensor, remaining: torch.Tensor, generated: torch.Tensor,
            baseline_total: float, max_tokens: int) -> dict[str, dict[str, float]]:
    """Errors of the predictions, clipped to the cap as the scheduler clips them."""
    pred_remaining = torch.minimum(pred_remaining, (max_tokens - generated).float())
    first = generated == 1
    out = {}
    for name, rows in (("first_token", first), ("all_refreshes", torch.ones_like(first))):
        p, t, g = pred_remaining[rows], remaining[rows], generated[rows].float()
        base = (baseline_total - g).clamp_min(0)
        out[name] = {"rows": int(rows.sum()),
                     "mae_tokens": float((p - t).abs().mean()),
                     "spearman": spearman(p.numpy(), t.numpy()),
                     "baseline_mae_tokens": float((base - t).abs().mean())}
    return out


def mean_length(data: dict[str, Any], prompts: list[int]) -> float:
    """The mean answer length over every recorded answer to ``prompts`` (the baseline's
    prediction): ``data["lengths"]`` is [answer, prompt], or [prompt] with one answer each."""
    lengths = data["lengths"].float()
    return float(lengths.reshape(-1, lengths.shape[-1])[:, prompts].mean())


def train(data: dict[str, Any], train_prompts: list[int], test_prompts: list[int], *,
          max_tokens: int, progress: bool = True, seed: int = 0) -> Result:
    pidx, gen = data["prompt_index"], data["generated"]
    remaining = data["remaining"]
    y = torch.log1p(remaining)
    g = torch.Generator().manual_seed(seed)
    shuffled = [train_prompts[i] for i in torch.randperm(len(train_prompts), generator=g)]
    val_prompts = shuffled[: max(1, len(shuffled) // 5)]

    def rows_of(prompts: list[int]) -> torch.Tensor:
        return torch.isin(pidx, torch.tensor(prompts, dtype=pidx.dtype))

    in_train, in_val, in_test = rows_of(train_prompts), rows_of(val_prompts), rows_of(test_prompts)
    in_fit = in_train & ~in_val
    baseline = mean_length(data, train_prompts)

    validation: dict[str, dict[str, float]] = {}
    best_layer, best_err, best_epochs = None, float("inf"), MAX_EPOCHS
    for layer, feats in sorted(data["feats"].items()):
        mlp, epochs, err = _fit(feats[in_fit], y[in_fit], MAX_EPOCHS,
                                (feats[in_val], y[in_val]), seed)
        with torch.no_grad():
            pred = torch.expm1(mlp(feats[in_val])).clamp_min(0)
        scores = _scores(pred, remaining[in_val], gen[in_val], baseline, max_tokens)
        validation[str(layer)] = {"log_l1": err, "epochs": epochs,
                                  **{f"{k}_{m}": v for k, d in scores.items()
                                     for m, v in d.items()}}
        if progress:
            print(f"layer {layer}: validation log-L1 {err:.3f} at epoch {epochs}; first-token "
                  f"MAE {scores['first_token']['mae_tokens']:.1f} tokens, Spearman "
                  f"{scores['first_token']['spearman']:.3f}", file=sys.stderr)
        if err < best_err:
            best_layer, best_err, best_epochs = int(layer), err, epochs
    assert best_layer is not None
    feats = data["feats"][best_layer]
    mlp, _, _ = _fit(feats[in_train], y[in_train], best_epochs, None, seed)
    with torch.no_grad():
        pred = torch.expm1(mlp(feats[in_test])).clamp_min(0)
    held_out = _scores(pred, remaining[in_test], gen[in_test], baseline, max_tokens)
    return Result(best_layer, {"layer": best_layer, **mlp.weights()}, validation, held_out)
