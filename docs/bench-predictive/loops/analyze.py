"""How the loop check changes the predictor's estimates as decoding proceeds (issue 12).

Reads ``collect.py``'s answers (their tokens and the shipped probe's estimate of the tokens
still to come at each refresh) and, for each n, flags a refresh whose answer so far loops
(``worker_svc.loops.loops``: its last n tokens occur earlier in it) and replaces its estimate
by the tokens left to the cap, as the worker does. Prints, over every refresh of every answer:
the rows flagged, the answers flagged among those that ran to the cap and those that ended on
their own, where a looping answer is first flagged, and the estimates' mean absolute error and
Spearman correlation with the tokens still to come, without the check and with it. Both are
bounded by the cap, as the scheduler bounds them.

Usage: python docs/bench-predictive/loops/analyze.py ANSWERS.json [--ngrams 16,24,32,48]
"""

from __future__ import annotations

import argparse
import json
import pathlib
import statistics
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

from fastserve.predictor.rank import spearman
from worker_svc.loops import loops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("answers")
    p.add_argument("--ngrams", default="16,24,32,48")
    args = p.parse_args()
    data = json.loads(pathlib.Path(args.answers).read_text())
    cap, answers = data["max_tokens"], data["answers"]
    capped = sum(a["capped"] for a in answers)
    print(f"{args.answers}: {len(answers)} answers ({data['split']} prompts, seed "
          f"{data['seed']}), {capped} ran to the cap of {cap}")
    print(f"{'n':>3} {'rows':>5} {'flagged':>8} {'of them ended':>14} {'capped flagged':>15} "
          f"{'others flagged':>15} {'first flag, median':>19} {'MAE':>14} {'Spearman':>16}")
    for n in (int(x) for x in args.ngrams.split(",")):
        truth, probe, checked, first = [], [], [], []
        flagged_rows = early_rows = capped_flagged = others_flagged = 0
        for a in answers:
            length, seen = len(a["tokens"]), False
            for g, est in a["estimates"]:
                left = cap - g
                flag = loops(a["tokens"][:g], n)
                truth.append(length - g)
                probe.append(min(est, left))
                checked.append(left if flag else min(est, left))
                if flag:
                    flagged_rows += 1
                    early_rows += not a["capped"]
                    if not seen and a["capped"]:
                        first.append(g)
                    seen = True
            capped_flagged += seen and a["capped"]
            others_flagged += seen and not a["capped"]
        mae = [statistics.mean(abs(t - e) for t, e in zip(truth, est)) for est in (probe, checked)]
        rho = [spearman(est, truth) for est in (probe, checked)]
        print(f"{n:3d} {len(truth):5d} {flagged_rows:8d} {early_rows:14d} "
              f"{capped_flagged:>9d} of {capped:<3d} {others_flagged:>9d} of "
              f"{len(answers) - capped:<3d} {statistics.median(first) if first else '-':>19} "
              f"{mae[0]:6.1f} -> {mae[1]:5.1f} {rho[0]:7.3f} -> {rho[1]:.3f}")


if __name__ == "__main__":
    main()
