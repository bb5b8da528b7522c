"""`fastserve sim`: replay a trace through the production scheduler on a simulated worker.

Each policy runs the same requests on a cost model (published constants or a worker's profile)
and one summary row per policy goes to stdout; progress goes to stderr. With ``--slo-search``,
each policy's throughput at the paper's SLO (mean latency per output token under 10x one decode
iteration) is searched over the given rates and compared with fcfs.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from scheduler_svc.config_args import (
    DEFAULTS,
    FIELDS,
    add_config_args,
    given,
    parse_value,
    policy_names,
)
from scheduler_svc.core.config import SchedulerConfig

_TABLE = (  # (header, summary key, scale, format)
    ("policy", "label", None, "<26"),
    ("req/s", "rate", 1.0, ">7.2f"),
    ("n", "num_requests", None, ">7"),
    ("JCT mean s", "mean_jct_s", 1.0, ">10.2f"),
    ("p50", "p50_jct_s", 1.0, ">8.2f"),
    ("p95", "p95_jct_s", 1.0, ">8.2f"),
    ("p99", "p99_jct_s", 1.0, ">8.2f"),
    ("TTFT mean s", "mean_ttft_s", 1.0, ">11.3f"),
    ("p95", "p95_ttft_s", 1.0, ">8.3f"),
    ("lat/tok ms", "mean_latency_per_token_s", 1e3, ">10.1f"),
    ("p95", "p95_latency_per_token_s", 1e3, ">8.1f"),
    ("tok/s", "throughput_tokens_s", 1.0, ">8.0f"),
    ("preempt", "num_preemptions", None, ">8"),
    ("recomp", "num_recomputes", None, ">7"),
    ("swap out", "num_swap_outs", None, ">8"),
    ("swap wait s", "swap_wait_s", 1.0, ">11.2f"),
)


def add_parser(sub: argparse._SubParsersAction) -> None:
    """Register the sim command."""
    p = sub.add_parser("sim", help="simulate scheduling policies on a trace (no GPU, no model)",
                       description="Replay a trace through the production scheduler and "
                       "policies on a simulated worker whose iteration times come from a cost "
                       "model.")
    p.add_argument("--trace", required=True, metavar="FILE",
                   help="trace file: Azure CSV, ShareGPT lengths CSV or .jsonl")
    p.add_argument("--policies", default=None, type=_str_list, metavar="A,B,C",
                   help="several policies, one run each on the same requests (overrides --policy)")
    p.add_argument("--rate", type=float, default=None,
                   help="mean arrival rate, requests/s (default: the trace's own timestamps)")
    p.add_argument("--num-requests", type=int, default=None,
                   help="first N requests, or the trace repeated up to N")
    cost = p.add_mutually_exclusive_group()
    cost.add_argument("--cost-model", default="opt-13b-a100",
                      help="published cost model, one device's times: opt-13b-a100 "
                      "(default), opt-66b-a100, opt-175b-a100 (the last two need "
                      "--tensor-parallel / --pipeline-parallel to fit their weights: 4 and 8 "
                      "A100s in the published settings)")
    cost.add_argument("--profile", default=None, metavar="PROFILE.json",
                      help="a worker's profile (worker_svc/profiler.py JSON) as the cost model")
    # OPT-13B keeps 800 KiB of KV per token (2 x 40 layers x 5120 x fp16); an A100-80GB has
    # about 50 GB left after weights and activations: ~64k tokens, 4096 blocks of 16.
    p.add_argument("--num-blocks", type=int, default=4096,
                   help="KV blocks (default 4096: OPT-13B on one A100-80GB)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--kv-policies", default=None, type=_str_list, metavar="A,B",
                   help="KV policies (proactive, reactive, recompute, defer): every scheduling "
                   "policy runs with each (default: the scheduler's, proactive)")
    p.add_argument("--store-blocks", type=int, default=0,
                   help="KV store capacity in blocks for offloaded KV (default 0: no store)")
    p.add_argument("--replicas", type=int, default=1,
                   help="worker groups, each with its own pool and store share; a request "
                   "joins the least loaded (fewest live jobs, then most free blocks), as the "
                   "cluster layer places it (default 1)")
    p.add_argument("--tensor-parallel", type=_at_least_one, default=1, metavar="T",
                   help="tensor-parallel ranks per worker group: compute / T plus two "
                   "all-reduces per layer (default 1)")
    p.add_argument("--pipeline-parallel", type=_at_least_one, default=1, metavar="P",
                   help="pipeline stages per worker group: each holds a batch 1/P of its "
                   "latency, and the group keeps up to P batches in flight (--set "
                   "steps_in_flight=N to change that) (default 1)")
    p.add_argument("--swap-gbps", type=float, default=None,
                   help="device <-> store copy bandwidth of a group, GB/s (default: the cost "
                   "model's, T x P times one device's)")
    p.add_argument("--kv-bytes-per-token", type=int, default=None,
                   help="KV bytes per token, all layers (default: the cost model's)")
    p.add_argument("--max-context", type=int, default=None,
                   help="tokens per request at most (default: num_blocks * block_size)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="settings",
                   help="a scheduler setting by its field name, e.g. --set starve_limit_s=1 "
                   "(repeatable; the options below win over it)")
    p.add_argument("--length-scale", type=float, default=1.0,
                   help="divide every token length by this")
    p.add_argument("--max-input", type=int, default=None)
    p.add_argument("--max-output", type=int, default=None)
    p.add_argument("--arrivals", choices=("poisson", "gamma"), default=None,
                   help="synthesized arrivals (default: the trace's timestamps, or poisson "
                   "for a trace without them); given, they replace a trace's timestamps")
    p.add_argument("--cv", type=float, default=1.0, help="Gamma arrivals' coefficient of variation")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prediction-sigma", type=float, default=None, metavar="SIGMA",
                   help="give jobs predicted output lengths: the true length times lognormal "
                        "noise exp(N(0, SIGMA)) (0: exact), for the predictive policy")
    p.add_argument("--predictions", default=None, metavar="FILE",
                   help="recorded predicted output lengths instead: one line per request of the "
                        "trace, in its order, a number or {\"predicted_output_tokens\": N}")
    p.add_argument("--prediction-refresh", type=int, default=0, metavar="N",
                   help="predict as the worker's probe does: nothing before a job's first "
                        "token, then at it and every N tokens after, the true remaining "
                        "length times the job's own error (default 0: once, at arrival)")
    p.add_argument("--predict-at-arrival", action="store_true",
                   help="with --prediction-refresh: the first prediction at arrival too, as if "
                        "the prompt alone predicted as well as the probe's first estimate")
    p.add_argument("--prediction-refresh-corr", type=float, default=1.0, metavar="RHO",
                   help="with --prediction-refresh: draw the error anew at each refresh, an "
                        "AR(1) in log space with this correlation from one refresh to the next "
                        "(default 1: the job's first error throughout)")
    p.add_argument("--arrival-probe-error", type=float, default=0.0, metavar="SIGMA",
                   help="with --prediction-refresh: the estimates at arrival that a policy "
                        "ranking by predictions gets (as the service does, from the prompt's "
                        "last --set arrival_probe_tokens=K tokens, 128 by default; 0 turns them "
                        "off) are the first token's estimate times exp(N(0, SIGMA)) when the "
                        "tail is shorter than the prompt (default 0: as good as the first "
                        "token's)")
    p.add_argument("--slo-search", default=None, type=_float_list, metavar="R1,R2,...",
                   help="also search throughput at the SLO over these rates (requests/s), "
                   "printed beside the rate no policy could sustain on the trace (a rate at the "
                   "SLO above it is a transient of the trace's length)")
    p.add_argument("--slo", type=float, default=None, metavar="S",
                   help="SLO, seconds per output token (default 10x one decode iteration)")
    p.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="with --slo-search: search again with arrival seeds --seed+1 .. "
                   "--seed+N-1 (arrivals and prediction noise drawn anew, lengths the same) "
                   "and print each policy's rate and ratio to fcfs per seed, with their median "
                   "and minimum: one seed's ratio can be far from another's")
    p.add_argument("--refine", type=int, default=2,
                   help="bisection steps after the SLO grid search (default 2)")
    p.add_argument("--json", default=None, metavar="OUT",
                   help="write the list of per-policy summaries (with SLO results) as JSON")
    add_config_args(p, defaults=False)
    p.set_defaults(func=run)


def _str_list(text: str) -> list[str]:
    return [s.strip() for s in text.split(",") if s.strip()]


def _at_least_one(text: str) -> int:
    """An integer >= 1 (argparse names the option in its error)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def _float_list(text: str) -> list[float]:
    try:
        return [float(s) for s in _str_list(text)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected numbers like 1,2,4, got {text!r}") from None


def load_profile_cost_model(path: str | Path):  # -> CostModel
    """A ``CostModel`` from the JSON that ``worker_svc/profiler.py`` caches."""
    from scheduler_svc.core.cost_model import CostModel

    try:
        data = json.loads(Path(path).read_text())
        decode = [(p["batch_size"], p["time_s"]) for p in data["decode"]]
        prefill = [(p["num_tokens"], p["time_s"]) for p in data["prefill"]]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise ValueError(f"{path}: not a worker profile ({type(e).__name__}: {e}); expected "
                         '{"decode": [{"batch_size", "time_s"}...], '
                         '"prefill": [{"num_tokens", "time_s"}...]}') from None
    return CostModel.from_profile(decode, prefill, name=f"profile:{Path(path).stem}")


def _parse_settings(items: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` strings -> SchedulerConfig keyword arguments, typed by the field."""
    names = [f.name for f in FIELDS]
    out: dict[str, object] = {}
    for item in items:
        key, sep, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or key not in names:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE with KEY one of "
                             f"{', '.join(names)}")
        try:
            out[key] = parse_value(key, value)
        except ValueError as e:
            raise ValueError(f"--set {e}") from None
    return out


def _format_row(summary: dict) -> str:
    cells = []
    for _, key, scale, fmt in _TABLE:
        v = summary[key]
        cells.append(format(v * scale if scale is not None else v, fmt))
    return " ".join(cells)


def _header() -> str:
    cells = []
    for name, _, _, fmt in _TABLE:
        width = int("".join(c for c in fmt.split(".")[0] if c.isdigit()))
        cells.append(format(name, f"{fmt[0]}{width}"))
    return " ".join(cells)


def load_predictions(path: str) -> list[float]:
    """Predicted output lengths, one per line: a number or an object with
    ``predicted_output_tokens``; a bad line is named."""
    from fastserve.traces import json_lines

    out = []
    for n, _, value in json_lines(path, "the predictions file"):
        try:
            if isinstance(value, dict):
                value = value["predicted_output_tokens"]
            out.append(float(value))
        except (KeyError, TypeError, ValueError):
            raise ValueError(f"{path}:{n}: needs a number or an object with "
                             f"'predicted_output_tokens'") from None
    return out


def _core() -> str:
    """How this process runs the scheduler core (``scheduler_svc/compiled.py``)."""
    from scheduler_svc import compiled

    return "compiled (mypyc)" if compiled.active() else "interpreted"


def run(args: argparse.Namespace) -> int:
    from tqdm.auto import tqdm

    from fastserve.traces import load_trace
    from scheduler_svc.core.cost_model import PUBLISHED
    from scheduler_svc.sim import default_slo, simulate, sustainable_rate, throughput_at_slo

    try:
        settings = {**_parse_settings(args.settings), **given(args)}
    except ValueError as e:
        print(f"fastserve sim: {e}", file=sys.stderr)
        return 2
    policies = args.policies or [settings.get("policy", DEFAULTS.policy)]
    registered = policy_names()
    unknown = [p for p in policies if p not in registered]
    if unknown:
        print(f"fastserve sim: unknown policy {', '.join(map(str, unknown))}; registered: "
              f"{', '.join(registered)}", file=sys.stderr)
        return 2
    try:
        if args.profile:
            cost_model = load_profile_cost_model(args.profile)
        elif args.cost_model in PUBLISHED:
            cost_model = PUBLISHED[args.cost_model]
        else:
            raise ValueError(f"--cost-model must be one of {', '.join(sorted(PUBLISHED))}, "
                             f"got {args.cost_model!r} (or give --profile)")
        try:
            cost_model = cost_model.split(args.tensor_parallel, args.pipeline_parallel)
        except ValueError as e:
            raise ValueError(f"--tensor-parallel {args.tensor_parallel} --pipeline-parallel "
                             f"{args.pipeline_parallel}: {e}") from None
        kv_policies = args.kv_policies or [settings.get("kv_policy", DEFAULTS.kv_policy)]
        configs = {}  # label -> config: one run per scheduling policy and KV policy
        for p in policies:
            for kv in kv_policies:
                label = p if len(kv_policies) == 1 else f"{p}+{kv}"
                configs[label] = SchedulerConfig(**{**settings, "policy": p, "kv_policy": kv})
        if args.swap_gbps is not None or args.kv_bytes_per_token is not None:
            cost_model = dataclasses.replace(
                cost_model,
                swap_bytes_per_s=(args.swap_gbps * 1e9 if args.swap_gbps is not None
                                  else cost_model.swap_bytes_per_s),
                kv_bytes_per_token=(args.kv_bytes_per_token
                                    if args.kv_bytes_per_token is not None
                                    else cost_model.kv_bytes_per_token))

        def trace(rate: float | None, seed: int = args.seed) -> list:
            return load_trace(args.trace, rate=rate, arrivals=args.arrivals, cv=args.cv,
                              length_scale=args.length_scale, max_input=args.max_input,
                              max_output=args.max_output, num_requests=args.num_requests,
                              seed=seed)

        requests = trace(args.rate)
        predictions = load_predictions(args.predictions) if args.predictions else None
        if args.seeds < 1:
            raise ValueError(f"--seeds must be at least 1, got {args.seeds}")
    except ValueError as e:
        print(f"fastserve sim: {e}", file=sys.stderr)
        return 2
    sim = {"cost_model": cost_model, "num_blocks": args.num_blocks,
           "block_size": args.block_size, "max_context": args.max_context,
           "store_blocks": args.store_blocks, "prediction_sigma": args.prediction_sigma,
           "prediction_seed": args.seed, "predictions": predictions,
           "prediction_refresh": args.prediction_refresh,
           "predict_at_arrival": args.predict_at_arrival,
           "prediction_refresh_corr": args.prediction_refresh_corr,
           "arrival_probe_error": args.arrival_probe_error,
           "replicas": args.replicas}

    rows: list[dict] = []
    for label, config in configs.items():
        try:
            with tqdm(total=len(requests), desc=label, unit="req", file=sys.stderr,
                      leave=False) as bar:
                result = simulate(requests, config=config, rate=args.rate,
                                  progress=bar.update, **sim)
        except (RuntimeError, ValueError) as e:  # a stalled scheduler, a bad pool size
            print(f"fastserve sim: {label}: {e}", file=sys.stderr)
            return 1
        if result.num_skipped or result.num_clipped:
            print(f"{label}: {result.num_skipped} requests skipped (prompt >= max context), "
                  f"{result.num_clipped} outputs clipped to the max context", file=sys.stderr)
        rows.append({"label": label, **result.summary()})
    print(f"trace {args.trace}  cost model {cost_model.name}  blocks {args.num_blocks} x "
          f"{args.block_size}  store blocks {args.store_blocks}  replicas {args.replicas}  "
          f"max batch "
          f"{next(iter(configs.values())).max_batch_size}  core {_core()}")
    print(_header())
    for row in rows:
        print(_format_row(row))

    if args.slo_search:
        slo = args.slo if args.slo is not None else default_slo(cost_model)
        first = next(iter(configs.values()))
        # The bound reads the lengths only, which the arrival seed leaves as they are.
        bound = sustainable_rate(requests, cost_model=cost_model, num_blocks=args.num_blocks,
                                 block_size=args.block_size, max_context=args.max_context,
                                 max_batch_size=first.max_batch_size,
                                 max_batched_tokens=first.max_batched_tokens,
                                 replicas=args.replicas)

        def search(seed: int) -> dict:
            """Every policy's search on the requests of arrival seed ``seed``."""
            found = {}
            for label, config in configs.items():
                with tqdm(desc=f"{label} SLO search, seed {seed}", unit="req", file=sys.stderr,
                          leave=False) as bar:
                    found[label] = throughput_at_slo(
                        functools.partial(trace, seed=seed), args.slo_search, slo,
                        config=config, refine_steps=args.refine, progress=bar.update,
                        **{**sim, "prediction_seed": seed})
            return found

        seeds = list(range(args.seed, args.seed + args.seeds))
        by_seed = [search(seed) for seed in seeds]
        base_label = next((lb for lb, c in configs.items() if c.policy == "fcfs"), None)
        searches = by_seed[0]
        base = searches[base_label].rate if base_label else None
        print(f"\nthroughput at the SLO (mean latency per token <= {slo * 1e3:.1f} ms), "
              f"searched over {','.join(f'{r:g}' for r in args.slo_search)} req/s")
        if bound is not None:
            print(f"no policy sustains more than {bound.rate:.3f} req/s on these requests "
                  f"(at least {bound.least_s:,.0f} s of iterations; the "
                  f"{'KV pool' if bound.binds == 'pool' else 'batch limit'} binds): a rate at "
                  f"the SLO above it (*) is a transient of the trace's length")
        print(f"{'policy':<26} {'req/s at SLO':>12} {'vs fcfs':>8}  curve (req/s: ms/token)")
        for label, row in zip(configs, rows):
            s = searches[label]
            ratio = _ratio(s.rate, base)
            curve = ", ".join(f"{p.rate:g}: {'>' if p.lower_bound else ''}"
                              f"{p.mean_latency_per_token_s * 1e3:.0f}" for p in s.curve)
            print(f"{label:<26} {_fmt(s.rate, '>11.3f')}{_star(s.rate, bound)} "
                  f"{_fmt(ratio, '>7.2f')}{'x' if ratio else ' '}  {curve}")
            row.update({
                "sustainable_rate_bound": bound.rate if bound is not None else None,
                "slo_s_per_token": slo, "rate_at_slo": s.rate, "slo_ratio_vs_fcfs": ratio,
                "slo_curve": [{"rate": p.rate,
                               "mean_latency_per_token_s": p.mean_latency_per_token_s,
                               "meets_slo": p.meets_slo,
                               "lower_bound": p.lower_bound} for p in s.curve],
            })
        if len(seeds) > 1:
            _print_by_seed(seeds, by_seed, bound, base_label, configs, rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return 0


def _star(rate: float | None, bound: Any) -> str:
    """'*' on a rate at the SLO above the bound no policy passes."""
    return "*" if bound is not None and rate is not None and rate > bound.rate else " "


def _ratio(rate: float | None, base: float | None) -> float | None:
    """A rate at the SLO over fcfs's (None where either is missing)."""
    return rate / base if rate is not None and base else None


def _print_by_seed(seeds: list[int], by_seed: list[dict], bound: Any, base_label: str | None,
                   configs: dict, rows: list[dict]) -> None:
    """Each policy's rate at the SLO and its ratio to fcfs's on the same arrivals, per seed,
    with the ratios' median and minimum (into ``rows`` too)."""
    print("\nby arrival seed: req/s at the SLO (* above the bound) and / fcfs")
    head = "".join(f"{'seed ' + str(seed):>16}" for seed in seeds)
    print(f"{'policy':<26}{head} {'median':>7} {'min':>6}")
    for label, row in zip(configs, rows):
        cells, ratios, records = [], [], []
        for seed, found in zip(seeds, by_seed):
            rate = found[label].rate
            ratio = _ratio(rate, found[base_label].rate if base_label else None)
            cells.append(f"{_fmt(rate, '>8.3f')}{_star(rate, bound)}"
                         f"{_fmt(ratio, '>6.2f')}{'x' if ratio else ' '}")
            if ratio is not None:
                ratios.append(ratio)
            records.append({"seed": seed, "rate_at_slo": rate, "slo_ratio_vs_fcfs": ratio,
                            "sustainable_rate_bound": bound.rate if bound else None})
        median = statistics.median(ratios) if ratios else None
        least = min(ratios) if ratios else None
        print(f"{label:<26}{''.join(cells)} {_fmt(median, '>6.2f')}{'x' if median else ' '}"
              f"{_fmt(least, '>5.2f')}{'x' if least else ' '}")
        row.update({"slo_by_seed": records, "slo_ratio_median": median,
                    "slo_ratio_min": least})


def _fmt(value: float | None, fmt: str) -> str:
    width = "".join(c for c in fmt.split(".")[0] if c.isdigit())
    return format(value, fmt) if value is not None else format("-", f">{width}")
