"""Can the scheduler predict an answer's length from the prompt alone, before the prefill?

The worker's probe predicts from the hidden state at the prompt's last token, so a new job has
no prediction until its prefill has run. A prediction at arrival would let ``predictive`` rank
new jobs while they wait (in simulation it is worth most of the gain at the SLO: see
docs/benchmarks.md, "Predictions when the worker makes them"). Without another model, what the
scheduler could hold is the served model's input embeddings: this fits the two cheap
predictors they allow and scores them on the held-out prompts, beside the training mean:

- ridge regression of ``log(1 + output tokens)`` on the prompt's mean input embedding and
  ``log(1 + prompt tokens)`` (linear in the mean embedding, so it would fold into one score per
  vocabulary entry: a table lookup at admission), the penalty chosen on validation prompts;
- the mean answer of the k training prompts nearest by that mean embedding (cosine).

Usage (the data file is what ``fastserve predictor train --data FILE`` records):
    python docs/bench-predictive/prompt_prior.py /tmp/pred-data.pt
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Sequence

import torch

from fastserve.models import resolve_model
from fastserve.predictor.rank import spearman
from fastserve.predictor.split import split
from scheduler_svc.api.text import TextModel
from worker_svc.loader import EngineConfig, load_engine

PENALTIES = (1.0, 10.0, 100.0, 1000.0, 10000.0)
NEIGHBOURS = (5, 10, 20, 40)


def mean_embeddings(embed: torch.Tensor, prompts: Sequence[Sequence[int]]) -> torch.Tensor:
    """``[prompts, hidden + 1]``: each prompt's mean input embedding and log(1 + length)."""
    return torch.stack([torch.cat([embed[torch.tensor(list(ids))].double().mean(0),
                                   torch.tensor([math.log1p(len(ids))], dtype=torch.float64)])
                        for ids in prompts])


def ridge(x: torch.Tensor, y: torch.Tensor, penalty: float):
    mean, std = x.mean(0), x.std(0).clamp_min(1e-8)
    z = (x - mean) / std
    w = torch.linalg.solve(z.T @ z + penalty * torch.eye(z.shape[1], dtype=z.dtype),
                           z.T @ (y - y.mean()))
    return lambda q: ((q - mean) / std) @ w + y.mean()


def scores(predicted: torch.Tensor, lengths: torch.Tensor) -> dict[str, float]:
    log_err = torch.log(predicted.clamp_min(1.0) / lengths.clamp_min(1.0))
    rho = spearman(predicted.numpy(), lengths.numpy())  # NaN for a constant prediction
    return {"mae_tokens": round(float((predicted - lengths).abs().mean()), 1),
            "spearman": None if math.isnan(rho) else round(rho, 3),
            "log_error_sigma": round(float(log_err.std()), 3)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data", help="a `fastserve predictor train --data` file")
    p.add_argument("--holdout", type=float, default=0.2)
    args = p.parse_args()
    data = torch.load(args.data, weights_only=True)
    settings = data["settings"]
    instructions = list(settings["prompts"])
    train, test = split(instructions, args.holdout)
    g = torch.Generator().manual_seed(0)  # the probe's validation prompts (fit.train)
    shuffled = [train[i] for i in torch.randperm(len(train), generator=g)]
    val = shuffled[: max(1, len(shuffled) // 5)]
    fit_idx = [i for i in train if i not in set(val)]
    model_path = str(resolve_model(settings["model"]))
    text = TextModel.load(model_path)
    prompts = [text.render_chat([("user", t)]) for t in instructions]
    embed = load_engine(EngineConfig(settings["model"], num_blocks=64,
                                     predictor="none")).engine.model.embed
    x = mean_embeddings(embed, prompts)
    lengths = data["lengths"].double().reshape(-1, len(instructions))[0]  # first answers
    y = torch.log1p(lengths)
    cap = float(settings["max_tokens"])

    def total(pred_log: torch.Tensor) -> torch.Tensor:
        return torch.expm1(pred_log).clamp(1.0, cap)

    out: dict[str, object] = {"train_prompts": len(train), "held_out_prompts": len(test)}
    out["training_mean"] = scores(torch.full((len(test),), float(lengths[train].mean()),
                                             dtype=torch.float64), lengths[test])
    val_mae = {pen: scores(total(ridge(x[fit_idx], y[fit_idx], pen)(x[val])),
                           lengths[val])["mae_tokens"] for pen in PENALTIES}
    best = min(PENALTIES, key=lambda pen: val_mae[pen])
    out["ridge"] = {"penalty": best, "validation_mae_by_penalty": val_mae,
                    **scores(total(ridge(x[train], y[train], best)(x[test])), lengths[test])}
    unit = x[:, :-1] - x[train, :-1].mean(0)
    unit = unit / unit.norm(dim=1, keepdim=True)
    near = unit[test] @ unit[train].T
    for k in NEIGHBOURS:
        pred = lengths[torch.tensor(train)][near.topk(k, dim=1).indices].mean(1)
        out[f"nearest_{k}"] = scores(pred, lengths[test])
    out["prompt_length_spearman"] = round(spearman([len(prompts[i]) for i in test],
                                                   lengths[test].numpy()), 3)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
