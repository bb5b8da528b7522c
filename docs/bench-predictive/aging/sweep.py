"""`predictive` with its key aged by arrival (`predictive_aging_s`), swept in two settings:

- the replays of runs 4 (Poisson) and 5b (Gamma CV 4) at the CPU cluster's own speed, with
  the real predictor's recorded predictions refreshed as the worker makes them, eight arrival
  seeds each (the tail sweep's cases, `docs/bench-predictive/tail/sweep.py`): each figure over
  FCFS's on the same arrivals, geometric mean over the seeds;
- the published GPU scale (OPT-13B/A100, batch 16, 4,096 blocks, a 40,000-block store,
  1,000 requests, prediction sigma 0.75 refreshed every 16 tokens): ShareGPT and the Azure
  conversations, near capacity with bursts (Gamma CV 4) and at 1.5x.

    python docs/bench-predictive/aging/sweep.py OUT_DIR [A,...]

Writes ``sweep.txt`` into OUT_DIR (the runs' JSON beside it, reused if there).
"""

from __future__ import annotations

import json
import math
import pathlib
import statistics
import subprocess
import sys

B = pathlib.Path(__file__).resolve().parents[1]
REPLAYS = {  # name: (replay folder, rate, arrivals, cv)
    "cpu replay, poisson (run 4)": ("sim4", "0.8126", "poisson", "1"),
    "cpu replay, gamma cv4 (run 5b)": ("sim5b", "0.80", "gamma", "4"),
}
SEEDS = range(1, 9)
GPU = {  # name: (trace, rate, arrival flags)
    "gpu, sharegpt 0.85x cv4": ("sharegpt_lengths_llama2", "0.75", ["--arrivals", "gamma",
                                                                    "--cv", "4"]),
    "gpu, conversations 0.85x cv4": ("AzureLLMInferenceTrace_conv", "1.5",
                                     ["--arrivals", "gamma", "--cv", "4"]),
    "gpu, sharegpt 1.5x": ("sharegpt_lengths_llama2", "1.3", []),
    "gpu, conversations 1.5x": ("AzureLLMInferenceTrace_conv", "2.7", []),
}
KEYS = ("mean_jct_s", "p95_jct_s", "mean_latency_per_token_s", "mean_ttft_s",
        "throughput_tokens_s")


def sim(out: pathlib.Path, name: str, args: list[str]) -> dict[str, dict]:
    path = out / f"{name}.json"
    if not path.exists():
        subprocess.run(["fastserve", "sim", *args, "--policies", "fcfs,predictive",
                        "--json", str(path)], check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.DEVNULL)
    return {r["policy"]: r for r in json.loads(path.read_text())}


def ratios(pairs: list[tuple[dict, dict]]) -> dict[str, float]:
    """Each figure of predictive / FCFS's, geometric mean over the pairs."""
    return {k: math.exp(statistics.mean(math.log(max(p[k], 1e-9) / max(f[k], 1e-9))
                                         for p, f in pairs)) for k in KEYS}


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    agings = [float(a) for a in (sys.argv[2] if len(sys.argv) > 2 else
                                 "0,2,5,10,20,50,150,500").split(",")]
    lines = [f"{'case':32s} {'aging s':>8s} " + " ".join(f"{k:>26s}" for k in KEYS)]
    for a in agings:
        for name, (folder, rate, arrivals, cv) in REPLAYS.items():
            d = B / folder
            pairs = []
            for seed in SEEDS:
                r = sim(out, f"{folder}-s{seed}-a{a:g}", [
                    "--trace", str(d / "trace.jsonl"), "--profile",
                    str(d / "cluster_profile.json"), "--num-blocks", "2048",
                    "--max-batch-size", "8", "--predictions", str(d / "predictions.jsonl"),
                    "--prediction-refresh", "16", "--prediction-refresh-corr", "0.8",
                    "--rate", rate, "--arrivals", arrivals, "--cv", cv, "--seed", str(seed),
                    "--predictive-aging", str(a)])
                pairs.append((r["predictive"], r["fcfs"]))
            rs = ratios(pairs)
            lines.append(f"{name:32s} {a:8g} " + " ".join(f"{rs[k]:26.3f}" for k in KEYS))
        for name, (trace, rate, flags) in GPU.items():
            r = sim(out, f"{trace}-{rate}-a{a:g}", [
                "--trace", f"../shared/traces/{trace}.csv", "--prediction-sigma", "0.75",
                "--prediction-refresh", "16", "--store-blocks", "40000", "--num-requests",
                "1000", "--max-batch-size", "16", "--rate", rate, *flags,
                "--predictive-aging", str(a)])
            rs = ratios([(r["predictive"], r["fcfs"])])
            lines.append(f"{name:32s} {a:8g} " + " ".join(f"{rs[k]:26.3f}" for k in KEYS))
        print("\n".join(lines[-6:]), flush=True)
    (out / "sweep.txt").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
