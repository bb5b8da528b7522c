"""Score length-probe artifacts on the held-out rows of one recording (issue 12).

``fastserve predictor train`` scores the probe it fits on the held-out prompts of its own
recording; this scores any artifacts (the shipped one, a new one) on the same rows, so two
probes trained on different recordings compare on equal terms. Figures at the first output
token and over every refresh, as ``fastserve/predictor/fit.py`` computes them, plus the
spread of the first estimate's log error, ``log(predicted total / true total)``: the sigma
the simulator's error model takes (``fastserve sim --prediction-sigma``).

Usage (from the repository root):
    python docs/bench-predictive/probe_compare.py /tmp/pred-data4.pt \
        worker_svc/predictors/SmolLM2-135M-Instruct.pt /tmp/pred4.pt
"""

from __future__ import annotations

import argparse
import json
import statistics

import torch

from fastserve.predictor.fit import _scores, mean_length
from fastserve.predictor.split import split
from worker_svc.predictor import LengthPredictor


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("data", help="a `fastserve predictor train --data` recording")
    p.add_argument("artifacts", nargs="+")
    p.add_argument("--holdout", type=float, default=0.2)
    args = p.parse_args()
    data = torch.load(args.data, weights_only=True)
    settings = data["settings"]
    instructions = list(settings["prompts"])
    train, test = split(instructions, args.holdout)
    rows = torch.isin(data["prompt_index"], torch.tensor(test))
    gen, remaining = data["generated"][rows], data["remaining"][rows]
    baseline = mean_length(data, train)
    first = gen == 1
    cap = float(settings["max_tokens"])
    out = {}
    for path in args.artifacts:
        # The worker's own predictor reads the artifact (any layer the recording holds).
        probe = LengthPredictor.load(path, int(data["hidden_size"]), max(data["feats"]) + 1)
        with torch.no_grad():
            pred = torch.expm1(probe.log_remaining(data["feats"][probe.layer][rows]))
        pred = pred.clamp_min(0)
        scores = _scores(pred, remaining, gen, baseline, int(cap))
        total_pred = (1 + pred[first]).clamp(max=cap)
        sigma = statistics.pstdev(torch.log(total_pred / (1 + remaining[first])).tolist())
        out[path] = {"layer": probe.layer, **scores,
                     "first_token_log_error_sigma": round(sigma, 3)}
    lengths = data["lengths"]
    print(json.dumps({"held_out_prompts": len(test), "answers_per_prompt": lengths.shape[0]
                      if lengths.dim() == 2 else 1, "scores": out}, indent=2))


if __name__ == "__main__":
    main()
