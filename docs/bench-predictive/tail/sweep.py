"""A pause budget for `predictive`'s tail, tried in the replays of runs 4 and 5 (not kept).

A job becomes *urgent* once its time in the system less (1 + F) x its running time exceeds
C seconds (it has been paused more than C plus F times what it ran); urgent jobs rank ahead of
every other job, first come first served, until they finish. C = F = infinity is `predictive`
as shipped; C = F = 0 is nearly FCFS. The rule is patched into the policy here (interpreted
core, fast-forward off through `steady_iterations` = 0) and swept over C and F on the replays
of run 4 (Poisson) and run 5b (Gamma CV 4) at the cluster's own speed, each on eight arrival
seeds, with the worker's prediction timing and errors redrawn at each refresh.

    python docs/bench-predictive/tail/sweep.py docs/bench-predictive/tail

writes ``sweep.txt`` (geometric means over the seeds of each figure / FCFS's on the same
arrivals) and ``tail.png`` (mean JCT against p95 JCT, both / FCFS).
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import pathlib
import statistics
import sys

os.environ["FASTSERVE_COMPILED"] = "0"  # the patch below is to the interpreted classes
ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

from fastserve import cli  # noqa: E402
from scheduler_svc.core.policies import predictive as P  # noqa: E402
from scheduler_svc.core.policies.ranked import Ranked  # noqa: E402

B = ROOT / "docs" / "bench-predictive"
CASES = {  # name: (replay folder, rate, arrivals, cv)
    "poisson (run 4)": ("sim4", "0.8126", "poisson", "1"),
    "gamma cv4 (run 5b)": ("sim5b", "0.80", "gamma", "4"),
}
SEEDS = range(1, 9)
KEYS = ("mean_jct_s", "p95_jct_s", "mean_latency_per_token_s", "mean_ttft_s")
BUDGETS = [(c, f) for c in (0.5, 1, 2, 4, 8, 16) for f in (0.1, 0.25, 0.5, 1)]


PR = P.Predictive
# The shipped methods, which every patch wraps (not the last patch's).
ORIGINAL = (PR.__init__, PR.add, PR.remove, PR.walk, PR.on_iteration, PR.on_start,
            PR.on_estimate)


def patch(c: float, f: float) -> None:
    """Give `Predictive` the pause budget (C, F); see the module doc."""
    pr = PR
    o_init, o_add, o_remove, o_walk, o_iter, o_start, o_est = ORIGINAL

    def init(self, config, cost_model=None):  # type: ignore[no-untyped-def]
        o_init(self, config, cost_model)
        self._ran_s = {}
        self._urgent = Ranked(lambda j: (j.arrival_time, 0, j.job_id))

    def add(self, job, now):  # type: ignore[no-untyped-def]
        o_add(self, job, now)
        self._ran_s[job.job_id] = 0.0

    def remove(self, job):  # type: ignore[no-untyped-def]
        jid = job.job_id
        self._ran_s.pop(jid, None)
        if self._urgent.remove(jid):
            self._jobs.pop(jid, None)
            return
        o_remove(self, job)

    def walk(self, now, skip):  # type: ignore[no-untyped-def]
        self._urgent.settle()
        for jid, job in list(self._jobs.items()):
            if jid not in self._urgent and (now - job.arrival_time
                                            - (1 + f) * self._ran_s[jid]) > c:
                if not self._boosted.remove(jid):
                    self._ranked.remove(jid)
                self._urgent.add(job)
                self.starvation.deadline.pop(jid, None)  # never promoted again
                self.starvation.times_promoted.pop(jid, None)
        yield from self._urgent.walk(skip)
        yield from o_walk(self, now, skip)

    def on_iteration(self, ran, elapsed_s, now):  # type: ignore[no-untyped-def]
        self._urgent.settle()
        for job in ran:
            if job.job_id in self._ran_s:
                self._ran_s[job.job_id] += elapsed_s
        o_iter(self, [j for j in ran if j.job_id not in self._urgent], elapsed_s, now)

    def enst(self, now, batch_size, iteration_s, started_only=False):  # type: ignore[no-untyped-def]
        return P.Policy.enst(self, now, batch_size, iteration_s)

    def on_start(self, job):  # type: ignore[no-untyped-def]
        self._urgent.start(job)
        o_start(self, job)

    def on_estimate(self, job, now):  # type: ignore[no-untyped-def]
        if job.job_id in self._urgent:
            return  # its place among the urgent is its arrival
        o_est(self, job, now)

    pr.__init__, pr.add, pr.remove, pr.walk, pr.on_iteration = (
        init, add, remove, walk, on_iteration)
    pr.enst, pr.on_start, pr.on_estimate = enst, on_start, on_estimate
    pr.steady_iterations = lambda self, batch, iteration_s, starts: 0


def run(policies: str, tmp: pathlib.Path) -> dict[str, dict[str, list[dict]]]:
    """{case: {policy: [summary per seed]}} for ``policies`` with the policy as patched."""
    out: dict[str, dict[str, list[dict]]] = {}
    for name, (folder, rate, arrivals, cv) in CASES.items():
        d = B / folder
        for seed in SEEDS:
            js = tmp / "run.json"
            with contextlib.redirect_stdout(io.StringIO()), \
                    contextlib.redirect_stderr(io.StringIO()):
                cli.main(["sim", "--trace", str(d / "trace.jsonl"), "--policies", policies,
                          "--profile", str(d / "cluster_profile.json"), "--num-blocks", "2048",
                          "--max-batch-size", "8", "--predictions",
                          str(d / "predictions.jsonl"), "--prediction-refresh", "16",
                          "--prediction-refresh-corr", "0.8", "--rate", rate, "--arrivals",
                          arrivals, "--cv", cv, "--seed", str(seed), "--json", str(js)])
            for row in json.loads(js.read_text()):
                out.setdefault(name, {}).setdefault(row["policy"], []).append(row)
    return out


def ratios(rows: list[dict], fcfs: list[dict]) -> dict[str, float]:
    """Each figure / FCFS's on the same arrivals, geometric mean over the seeds."""
    return {k: math.exp(statistics.mean(math.log(max(a[k], 1e-9) / max(b[k], 1e-9))
                                         for a, b in zip(rows, fcfs, strict=True)))
            for k in KEYS}


def main() -> None:
    out = pathlib.Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    points: dict[str, list[tuple[str, dict[str, float]]]] = {}
    base = run("fcfs,skip-join-mlfq,predictive,srpt-oracle", out)
    for name, by_policy in base.items():
        for policy in ("skip-join-mlfq", "predictive", "srpt-oracle"):
            points.setdefault(name, []).append(
                (policy, ratios(by_policy[policy], by_policy["fcfs"])))
    for c, f in BUDGETS:
        patch(c, f)
        for name, by_policy in run("fcfs,predictive", out).items():
            points[name].append((f"budget C={c} F={f}",
                                 ratios(by_policy["predictive"], by_policy["fcfs"])))
        print(f"C={c} F={f} done", file=sys.stderr)
    (out / "run.json").unlink(missing_ok=True)
    lines = [f"{'case':20s} {'policy':24s} " + " ".join(f"{k:>24s}" for k in KEYS)]
    for name, pts in points.items():
        for label, r in pts:
            lines.append(f"{name:20s} {label:24s} " + " ".join(f"{r[k]:24.3f}" for k in KEYS))
    (out / "sweep.txt").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, axes = plt.subplots(1, len(points), figsize=(12, 5), sharey=True)
    for ax, (name, pts) in zip(axes, points.items(), strict=True):
        budget = [r for label, r in pts if label.startswith("budget")]
        ax.scatter([r["mean_jct_s"] for r in budget], [r["p95_jct_s"] for r in budget],
                   c="tab:blue", s=18, label="predictive + pause budget (C, F swept)")
        for label, r in pts:
            if not label.startswith("budget"):
                ax.scatter([r["mean_jct_s"]], [r["p95_jct_s"]], marker="s", s=40, label=label)
        ax.scatter([1.0], [1.0], marker="*", s=120, c="k", label="fcfs")
        ax.axvline(0.7, ls=":", c="gray")
        ax.axhline(1.0, ls=":", c="gray")
        ax.fill_between([0.6, 0.7], 0.9, 1.0, color="tab:green", alpha=0.2, label="the goal")
        ax.set_xlim(0.6, 1.2)
        ax.set_title(name)
        ax.set_xlabel("mean JCT / fcfs")
    axes[0].set_ylabel("p95 JCT / fcfs")
    axes[0].legend(fontsize=7, loc="upper left")
    fig.suptitle("Replays of runs 4 and 5b, 8 arrival seeds each: no pause budget reaches "
                 "the goal's corner")
    fig.tight_layout()
    fig.savefig(out / "tail.png", dpi=110)


if __name__ == "__main__":
    main()
