"""How low can any schedule bring the mean JCT of a real-cluster run on this machine?

The engine's speed caps the output rate: with b jobs in an iteration it makes at most b tokens
in one iteration, which takes at least t(b), so the cluster makes output tokens at a rate no
higher than r(b) = b / t(b), and never higher than R(N) = the concave majorant of r over
b <= min(N, max batch) while N jobs are in the system. Over a run of length T (first arrival
to last finish) that makes W output tokens,

    W <= integral of R(N(t)) dt <= T * R(mean N)          (R concave: Jensen)

and the sum of the JCTs is the integral of N(t) (Little's law, exact on a finite run), so

    mean JCT >= T * R^-1(W / T) / n

whatever the order, preemption or batching of the jobs: only the speed by batch size enters.
t(b) is measured here on the bare engine at the shortest context (decode only, no prefill, no
predictor, no services: the fastest iterations the worker can run), its 10th percentile over
the repeats, so a bound from it alone errs low. With ``--cluster`` folders of `bench compare`
runs above capacity at other max batch sizes, the cluster's own rate with b jobs (its
saturated tokens/s, ``fastserve/bench/capacity.py``: an average over the contexts and
prefills of real answers, not a worst case) replaces the engine's for those b. The same with
steady arrivals (rate x mean output length in place of W / T) is printed as the stationary
bound.

    python docs/bench-predictive/jct_bound.py docs/bench-predictive/run3 \
        --cluster docs/bench-predictive/curve/b* --json OUT.json --plot OUT.png
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def step_times(model: str, max_batch: int, context: int, repeats: int) -> list[float]:
    """The 10th percentile of a decode iteration's wall time with b jobs of ``context``
    tokens, for b = 1 .. max_batch (seconds)."""
    from worker_svc.engine import JobCommand, NewJob, StepCommand
    from worker_svc.loader import EngineConfig, load_engine

    per_job = -(-(context + repeats + 8) // 16)
    loaded = load_engine(EngineConfig(model, num_blocks=max_batch * per_job,
                                      predictor="none", max_context=context + repeats + 16))
    engine = loaded.engine
    out = []
    for b in range(1, max_batch + 1):
        jobs = list(range(b))
        prompt = [100 + (i % 1000) for i in range(context)]
        engine.step(StepCommand(
            new_jobs=[NewJob(j, prompt, block_ids=list(range(j * per_job, (j + 1) * per_job)))
                      for j in jobs],
            commands=[JobCommand(j, context) for j in jobs]))
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            engine.step(StepCommand(commands=[JobCommand(j, 1) for j in jobs]))
            times.append(time.perf_counter() - t0)
        engine.step(StepCommand(free_job_ids=jobs))
        out.append(float(np.percentile(times[2:], 10)))
        print(f"  batch {b}: {out[-1] * 1e3:.1f} ms per iteration, at most "
              f"{b / out[-1]:.1f} tokens/s", file=sys.stderr)
    return out


def concave_majorant(rates: list[float]) -> np.ndarray:
    """R(0..len(rates)) on the integers: the upper hull of (0, 0), (b, rates[b-1])."""
    pts = [(0.0, 0.0)] + [(float(b), r) for b, r in enumerate(rates, 1)]
    hull: list[tuple[float, float]] = []
    for p in pts:
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (p[0] - x1) <= (p[1] - y1) * (x2 - x1):
                hull.pop()
            else:
                break
        hull.append(p)
    xs, ys = zip(*hull)
    # Never falling: with more jobs in the system the cluster can still run the best batch
    # of fewer (the saturated rate at max batch 8 may be measured below that at 7).
    return np.maximum.accumulate(np.interp(np.arange(len(pts)), xs, ys))


def inverse(majorant: np.ndarray, rate: float) -> float:
    """The least mean number of jobs in the system at which R reaches ``rate``."""
    if rate > majorant[-1]:
        return float("inf")
    return float(np.interp(rate, majorant, np.arange(len(majorant))))


def cluster_rates(folders: list[pathlib.Path]) -> dict[int, float]:
    """Max batch size -> the cluster's saturated output tokens/s, from fcfs runs above
    capacity (``fcfs_rate*.json``, or the capacity run of ``bench compare --loads``,
    ``fcfs_capacity.json``); of several runs at one batch size, the fastest."""
    out: dict[int, float] = {}
    for folder in folders:
        paths = [*folder.glob("fcfs_rate*.json"), *folder.glob("fcfs_capacity.json")]
        for path in paths:
            data = json.loads(path.read_text())
            rate = data["summary"].get("saturated_tokens_s")
            if rate is None:
                if len(paths) > 1:  # a run below capacity beside the capacity run
                    continue
                raise SystemExit(f"{path}: no request queued; not a run above capacity")
            b = int(data["config"]["max_batch_size"])
            out[b] = max(out.get(b, 0.0), float(rate))
    return out


def run_bound(path: pathlib.Path, majorant: np.ndarray) -> dict:
    data = json.loads(path.read_text())
    reqs = [r for r in data["requests"] if r.get("finish") is not None]
    n = len(reqs)
    work = sum(r["output_tokens"] for r in reqs)
    start = min(r["arrival"] for r in reqs)
    span = max(r["finish"] for r in reqs) - start
    mean_jct = float(np.mean([r["finish"] - r["arrival"] for r in reqs]))
    rate = data["config"]["rate"]
    mean_len = work / n
    return {"policy": data["summary"]["policy"], "n": n, "output_tokens": work,
            "span_s": span, "mean_jct_s": mean_jct,
            "run_bound_s": span * inverse(majorant, work / span) / n,
            "stationary_bound_s": inverse(majorant, rate * mean_len) / rate,
            "mean_jobs_in_system": mean_jct * n / span}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("runs", nargs="+", type=pathlib.Path,
                   help="bench compare output folders (their *_rate*.json)")
    p.add_argument("--model", default="SmolLM2-135M-Instruct")
    p.add_argument("--max-batch-size", type=int, default=8)
    p.add_argument("--context", type=int, default=32, help="tokens of each job's context")
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--cluster", nargs="*", type=pathlib.Path, default=[],
                   help="bench compare folders of fcfs above capacity, one per max batch size")
    p.add_argument("--json", type=pathlib.Path)
    p.add_argument("--plot", type=pathlib.Path)
    args = p.parse_args()

    print(f"decode iterations at a context of {args.context} tokens:", file=sys.stderr)
    times = step_times(args.model, args.max_batch_size, args.context, args.repeats)
    engine = [b / t for b, t in enumerate(times, 1)]
    cluster = cluster_rates(args.cluster)
    rates = [cluster.get(b, r) for b, r in enumerate(engine, 1)]
    for b, r in sorted(cluster.items()):
        print(f"  cluster, batch {b}: {r:.1f} tokens/s while saturated", file=sys.stderr)
    majorant = concave_majorant(rates)
    rows = []
    for folder in args.runs:
        for path in sorted(folder.glob("*_rate*.json")):
            rows.append({"run": folder.name, **run_bound(path, majorant)})
    fcfs = {r["run"]: r["mean_jct_s"] for r in rows if r["policy"] == "fcfs"}
    print("| run | policy | mean JCT | / fcfs | mean jobs in system | bound, this run | / fcfs "
          "| stationary bound | / fcfs |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        base = fcfs.get(r["run"], float("nan"))
        print(f"| {r['run']} | {r['policy']} | {r['mean_jct_s']:.2f} s | "
              f"{r['mean_jct_s'] / base:.2f}x | {r['mean_jobs_in_system']:.2f} | "
              f"{r['run_bound_s']:.2f} s | {r['run_bound_s'] / base:.2f}x | "
              f"{r['stationary_bound_s']:.2f} s | {r['stationary_bound_s'] / base:.2f}x |")
    if args.json:
        args.json.write_text(json.dumps({"context": args.context, "repeats": args.repeats,
                                         "iteration_s": times, "engine_rates": engine,
                                         "cluster_rates": cluster, "rates": rates,
                                         "majorant": majorant.tolist(), "runs": rows},
                                        indent=1) + "\n")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(6, 4))
        ax.plot(range(1, len(engine) + 1), engine, "o", label="bare engine, shortest context")
        if cluster:
            ax.plot(list(cluster), list(cluster.values()), "s", label="cluster, saturated")
        ax.plot(range(len(majorant)), majorant, "-", label="concave majorant R")
        for r in rows:
            if r["policy"] == "fcfs":
                need = r["output_tokens"] / r["span_s"]
                ax.axhline(need, ls="--", color="gray")
                ax.annotate(f"{r['run']}: W/T = {need:.0f} tok/s", (0.2, need + 2))
        ax.set_xlabel("jobs in an iteration")
        ax.set_ylabel("output tokens / s, at most")
        ax.set_title("Output rate by batch size: a floor under every schedule")
        ax.legend(loc="lower right")
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
