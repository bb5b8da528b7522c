"""`predictive`'s fallback for a job past its prediction, tried in simulation (not shipped).

A job past its prediction, or with none, ranks by the tokens it has made. Two such jobs swap
places token by token: each decode raises the running one's key past the paused one's. Under
overload without prediction refresh that is most of `predictive`'s 6.81 preemptions per
request, and every one is a plan the simulator must form. This compares that fallback with a
coarser one, the tokens made rounded up to a power of two (a job keeps its place among such
jobs until it doubles its output, as an MLFQ's doubling quanta do), by patching
``Predictive._remaining`` in an interpreted run:

- 2,000 Azure conversations at 3.6 req/s (2x capacity), OPT-13B/A100, batch 16, `defer`,
  sigma 0.75, without and with refresh every 16 tokens;
- the published GPU scale near capacity with bursts (the aging sweep's cases: Gamma CV 4,
  1,000 requests, sigma 0.75 refreshed every 16 tokens, a 40,000-block store);
- the replay of real-cluster run 4 at the cluster's speed (recorded predictions refreshed as
  the worker makes them), arrival seeds 1-4.

    FASTSERVE_COMPILED=0 python docs/bench-predictive/fallback/sweep.py OUT_DIR

Each row: `predictive`'s figures over FCFS's from the same run (geometric mean over seeds),
and its preemptions per request. Writes ``sweep.txt`` into OUT_DIR.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import statistics
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
os.environ["FASTSERVE_COMPILED"] = "0"  # the patch below needs the interpreted policy

from fastserve import cli  # noqa: E402
from scheduler_svc.core.policies.predictive import Predictive  # noqa: E402

B = ROOT / "docs" / "bench-predictive"
TRACES = ROOT.parent / "shared" / "traces"
KEYS = ("mean_jct_s", "p95_jct_s", "mean_latency_per_token_s", "throughput_tokens_s")
OVERLOAD = ["--trace", str(TRACES / "AzureLLMInferenceTrace_conv.csv"), "--num-requests",
            "2000", "--rate", "3.6", "--max-batch-size", "16", "--kv-policies", "defer",
            "--prediction-sigma", "0.75"]
GPU = ["--prediction-sigma", "0.75", "--prediction-refresh", "16", "--store-blocks", "40000",
       "--num-requests", "1000", "--max-batch-size", "16", "--arrivals", "gamma", "--cv", "4"]
CASES: dict[str, list[list[str]]] = {
    "overload 2x, no refresh": [OVERLOAD],
    "overload 2x, refresh 16": [[*OVERLOAD, "--prediction-refresh", "16"]],
    "gpu, sharegpt 0.85x cv4": [["--trace", str(TRACES / "sharegpt_lengths_llama2.csv"),
                                 "--rate", "0.75", *GPU]],
    "gpu, conversations 0.85x cv4": [["--trace", str(TRACES / "AzureLLMInferenceTrace_conv.csv"),
                                      "--rate", "1.5", *GPU]],
    "cpu replay, run 4": [["--trace", str(B / "sim4" / "trace.jsonl"), "--profile",
                           str(B / "sim4" / "cluster_profile.json"), "--num-blocks", "2048",
                           "--max-batch-size", "8", "--predictions",
                           str(B / "sim4" / "predictions.jsonl"), "--prediction-refresh", "16",
                           "--prediction-refresh-corr", "0.8", "--rate", "0.8126",
                           "--arrivals", "poisson", "--seed", str(seed)]
                          for seed in range(1, 5)],
}
PLAIN = Predictive._remaining


def pow2(predicted: float | None, made: int) -> float:
    if predicted is None or predicted <= made:
        return float(1 << (made - 1).bit_length()) if made > 0 else 0.0
    return predicted - made


def run(out: pathlib.Path, name: str, args: list[str]) -> dict[str, dict]:
    path = out / f"{name}.json"
    if not path.exists():
        cli.main(["sim", *args, "--policies", "fcfs,predictive", "--json", str(path)])
    return {r["policy"]: r for r in json.loads(path.read_text())}


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"{'case':32s} {'fallback':>8s} " + " ".join(f"{k:>26s}" for k in KEYS)
             + f" {'preemptions/request':>20s}"]
    for variant, remaining in (("made", PLAIN), ("pow2", pow2)):
        Predictive._remaining = staticmethod(remaining)  # type: ignore[method-assign]
        for case, arg_sets in CASES.items():
            pairs, preempt = [], []
            for i, args in enumerate(arg_sets):
                r = run(out, f"{case.replace(' ', '_').replace(',', '')}-{i}-{variant}", args)
                pairs.append((r["predictive"], r["fcfs"]))
                p = r["predictive"]
                preempt.append(p["num_preemptions"] / p["num_requests"])
            ratio = {k: math.exp(statistics.mean(math.log(p[k] / f[k]) for p, f in pairs))
                     for k in KEYS}
            lines.append(f"{case:32s} {variant:>8s} "
                         + " ".join(f"{ratio[k]:26.3f}" for k in KEYS)
                         + f" {statistics.mean(preempt):20.2f}")
            print(lines[-1], flush=True)
    (out / "sweep.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
