"""A ridge regression beside the probe (issue 12): does another fit of the same features read
more of the length from the prompt? One row per prompt (its first-token features at a layer),
the target the mean log length of its answers, the penalty chosen by 5-fold cross-validation
on the training prompts, scored on the held-out prompts against each answer (Spearman, spread
of the log error) and against the prompts' mean log length.

Usage: python docs/bench-predictive/probe_samples/ridge.py /tmp/pred-data4.pt
(a `fastserve predictor train --samples 4 --data` recording)
"""

from __future__ import annotations

import statistics
import sys

import torch

from fastserve.predictor.rank import spearman
from fastserve.predictor.split import split

PENALTIES = (10, 100, 300, 1000, 3000, 10000, 30000)


def ridge(z: torch.Tensor, y: torch.Tensor, fit: torch.Tensor, at: torch.Tensor,
          penalty: float) -> torch.Tensor:
    a, m = z[fit], y[fit].mean()
    eye = torch.eye(a.shape[1], dtype=a.dtype)
    w = torch.linalg.solve(a.T @ a + penalty * eye, a.T @ (y[fit] - m))
    return z[at] @ w + m


def main() -> None:
    d = torch.load(sys.argv[1], weights_only=True)
    train, test = split(list(d["settings"]["prompts"]), 0.2)
    lengths = d["lengths"].double()  # [answer, prompt]
    n = lengths.shape[1]
    y = torch.log(lengths).mean(0)  # each prompt's mean log length
    first = d["generated"] == 1
    index = d["prompt_index"][first]
    tr, te = torch.tensor(train), torch.tensor(test)
    perm = torch.randperm(len(train), generator=torch.Generator().manual_seed(0))
    folds = [tr[perm[i::5]] for i in range(5)]
    for layer in (14, 21):
        rows = d["feats"][layer][first].double()
        # One row per prompt: its answers' first-token features are the same (the prompt's).
        x = torch.zeros(n, rows.shape[1], dtype=torch.float64).index_add_(0, index, rows)
        x /= torch.zeros(n, dtype=torch.float64).index_add_(
            0, index, torch.ones(len(index), dtype=torch.float64))[:, None]
        z = (x - x[tr].mean(0)) / x[tr].std(0).clamp_min(1e-6)

        def cv_error(penalty: float, z: torch.Tensor = z) -> float:
            errors = []
            for f in folds:
                fit = tr[~torch.isin(tr, f)]
                errors.append(float((ridge(z, y, fit, f, penalty) - y[f]).abs().mean()))
            return statistics.mean(errors)

        penalty = min(PENALTIES, key=cv_error)
        p = ridge(z, y, tr, te, penalty)
        answers = [torch.log(lengths[k, te]) for k in range(lengths.shape[0])]
        rho = statistics.mean(spearman(p.tolist(), a.tolist()) for a in answers)
        sigma = statistics.mean(statistics.pstdev((p - a).tolist()) for a in answers)
        print(f"layer {layer} ridge penalty {penalty}: against each answer Spearman {rho:.3f} "
              f"sigma {sigma:.3f}; against the mean log length Spearman "
              f"{spearman(p.tolist(), y[te].tolist()):.3f}")


if __name__ == "__main__":
    main()
