"""A real-cluster `bench compare` run as a `fastserve sim` input: its requests as a trace, its
predictions, and the cluster's own speed by batch size as the cost model.

Writes into OUT: ``trace.jsonl`` (the fcfs run's arrivals, prompt and answer lengths),
``predictions.jsonl`` (the server's prediction of each answer's length, for ``predictive``),
and ``cluster_profile.json``: the worker's cached profile (``--profile``) with its decode
times replaced by the cluster's saturated time per iteration at each measured batch size
(b / saturated tokens/s of ``bench compare`` runs above capacity, ``--cluster`` folders as for
``jct_bound.py``), so the simulated iterations cost what the cluster's did, overheads
included (prefill chunks are then counted twice: a few percent here). Then:

    python docs/bench-predictive/sim_of_run.py docs/bench-predictive/run4 OUT \
        --profile ~/.cache/fastserve/profiles/KEY.json \
        --cluster docs/bench-predictive/curve4/b* docs/bench-predictive/run4
    fastserve sim --trace OUT/trace.jsonl --policies fcfs,skip-join-mlfq,predictive,srpt-oracle \
        --profile OUT/cluster_profile.json --num-blocks 2048 --max-batch-size 8 \
        --predictions OUT/predictions.jsonl
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

from jct_bound import cluster_rates


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run", type=pathlib.Path, help="bench compare folder with fcfs_rate*.json")
    p.add_argument("out", type=pathlib.Path)
    p.add_argument("--profile", type=pathlib.Path, required=True,
                   help="the worker's cached profile (prefill curve and format)")
    p.add_argument("--cluster", nargs="+", type=pathlib.Path, required=True)
    args = p.parse_args()
    [run] = sorted(args.run.glob("fcfs_rate*.json"))
    reqs = sorted(json.loads(run.read_text())["requests"], key=lambda r: r["arrival"])
    args.out.mkdir(parents=True, exist_ok=True)
    start = reqs[0]["arrival"]
    with open(args.out / "trace.jsonl", "w") as trace, \
            open(args.out / "predictions.jsonl", "w") as preds:
        for r in reqs:
            trace.write(json.dumps({"arrival_s": round(r["arrival"] - start, 6),
                                    "input_tokens": r["input_tokens"],
                                    "output_tokens": r["output_tokens"]}) + "\n")
            preds.write(json.dumps({"predicted_output_tokens":
                                    r["predicted_output_tokens"]}) + "\n")
    rates = cluster_rates(args.cluster)
    profile = json.loads(args.profile.read_text())
    for point in profile["decode"]:  # past the measured sizes: the largest one below
        b = max((k for k in rates if k <= point["batch_size"]), default=min(rates))
        point["time_s"] = point["batch_size"] / rates[b]
    profile["cache_key"] = f"cluster-{args.run.name}"
    (args.out / "cluster_profile.json").write_text(json.dumps(profile, indent=1))
    print(f"wrote {args.out}: {len(reqs)} requests; decode s/iteration by batch: " + ", ".join(
        f"{pt['batch_size']}: {pt['time_s'] * 1e3:.1f} ms" for pt in profile["decode"]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
