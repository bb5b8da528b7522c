"""`fastserve bench compare`: the same trace replayed against each scheduling policy.

Starts one local worker (its model loads once), then for each rate and each policy in turn a
scheduler with ``--policy P`` (any port) attached to it, replays the trace as
`fastserve bench serve` does (same arrivals, same synthesized prompts), and stops the
scheduler; the worker frees everything a scheduler left when its stream closes, so every
policy starts from an empty KV pool (``--fresh-worker`` restarts the worker too). Each run's
``run_profile`` (`fastserve.bench.run_profile`, from the scheduler's metrics and /proc) says
where its time went: iterations by kind, the mean batch, and the cores other work took.

Peers (``--peer NAME=URL``, any OpenAI-compatible server: vLLM, SGLang, llama.cpp) are
replayed the same trace after the policies, with the same client summary, so a side-by-side is
one command. With ``--peer-cmd NAME=COMMAND`` the peer is started fresh for each run (and
stopped after it), ready once ``URL/v1/models`` answers; without it, the server must be running.

Prints one table (a row per policy or peer, per rate) with each policy's mean and p95 JCT as a
multiple of FCFS's when fcfs is among the policies. Writes to ``--out-dir``: the JCT CDF of
every policy (``jct_cdf.png``), mean and p95 latency per token against the rate when there
are several rates (``latency_vs_rate.png``), ``summaries.json`` and one JSON per run with
every request (``<policy>_rate<R>.json``, as `bench serve --json` writes).

With ``--loads F,...`` the rates are fractions of FCFS's capacity on this workload, measured
first: every request sent at once to an FCFS scheduler, its output tokens per second while
requests queued (``saturated_tokens_s``, `fastserve.bench.capacity`) over the mean answer's
length, written to ``capacity.json`` (and the run to ``fcfs_capacity.json``).

With ``--prompts`` (natural lengths), ``srpt-oracle`` is told each answer's length as the first
run at the same rate measured it (``output_length_hint``; put another policy before it, or use
``--loads``, whose capacity run measures them): every request has its own sampling seed, so
later runs draw the same answers, up to float ties between batch shapes.

With ``--rounds N`` every run is made N times in turn, and the first once more at the end, so
that each run of the others lies between two of the first's (put fcfs first): a machine whose
speed drifts over the comparison moves the reference too. A last table gives each run's
tokens/s and mean JCT over the first's interpolated at its time (`fastserve.bench.rounds`).
"""

from __future__ import annotations

import argparse
import dataclasses
import pathlib
import shlex
import sys
import time
from typing import Any

from fastserve.bench import serve as bench_serve
from fastserve.bench.capacity import MIN_WAIT_S
from fastserve.bench.peers import peer_specs
from fastserve.bench.rounds import bracketed, format_bracketed, schedule
from fastserve.bench.run_profile import RunProfile, format_profiles
from fastserve.ports import free_port
from fastserve.traces import describe
from worker_svc.loops import LOOP_HELP, LOOP_NGRAM, ngram_arg

DEFAULT_OUT_DIR = "bench-compare"
# --loads: the capacity run sends the workload at this rate (requests/s), far above what any
# cluster serves, so that nearly every request waits in the queue from the start.
CAPACITY_PROBE_RATE = 1000.0


def _float_list(text: str) -> list[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        values = []
    if not values or min(values) <= 0:
        raise argparse.ArgumentTypeError(f"expected positive numbers, got {text!r}")
    return values


def _positive(text: str) -> float:
    [value] = _float_list(text)
    return value


def _name_list(text: str) -> list[str]:
    names = list(dict.fromkeys(x.strip() for x in text.split(",") if x.strip()))
    if not names:
        raise argparse.ArgumentTypeError(f"expected comma-separated names, got {text!r}")
    return names


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("compare", help="replay one trace against several scheduling policies")
    p.add_argument("--policies", type=_name_list, default=[],
                   help="comma-separated policies, e.g. fcfs,skip-join-mlfq")
    p.add_argument("--peer", action="append", default=[], metavar="NAME=URL",
                   help="an OpenAI-compatible server to replay the same trace against, e.g. "
                   "vllm=http://127.0.0.1:8001 (repeatable)")
    p.add_argument("--peer-cmd", action="append", default=[], metavar="NAME=COMMAND",
                   help="shell command that starts peer NAME; it is started before each of "
                   "its runs and stopped after (repeatable)")
    p.add_argument("--peer-model", action="append", default=[], metavar="NAME=MODEL",
                   help="model name sent to peer NAME (default: the first it lists)")
    p.add_argument("--peer-start-timeout", type=float, default=900.0,
                   help="seconds a started peer may take to answer /v1/models")
    bench_serve.add_trace_args(p)
    p.add_argument("--rates", type=_float_list, default=None,
                   help="comma-separated arrival rates (requests/s); each is run for every "
                   "policy (overrides --rate)")
    p.add_argument("--loads", type=_float_list, default=None,
                   help="comma-separated fractions of FCFS's capacity, e.g. 0.85,1.5,3: the "
                   "capacity is measured first (the workload sent at once to FCFS; output "
                   "tokens/s while requests queued over the mean answer), and each load is "
                   "run at that fraction of it (instead of --rate/--rates)")
    p.add_argument("--capacity-min-wait", type=_positive, default=MIN_WAIT_S, metavar="S",
                   help="with --loads: the wait in the server's queue that marks a request of "
                   "the capacity run as having found the cluster full (default %(default)g s; "
                   "lower it for a cluster that serves the whole workload in a few seconds)")
    p.add_argument("--rounds", type=int, default=1,
                   help="make every run this many times in turn, and the first once more at "
                   "the end, and print each run against the first's runs around it (default "
                   "%(default)s)")
    p.add_argument("--model", default=None, help="model (default: the default model)")
    p.add_argument("--device", default="cpu", help="torch device of the worker")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--kv-blocks", type=int, default=2048, help="worker KV pool size in blocks")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--max-batch-size", type=int, default=None)
    p.add_argument("--max-waiting", type=int, default=None,
                   help="scheduler waiting-queue bound (default: the number of requests, so "
                   "that none is refused)")
    p.add_argument("--kv-policies", type=_name_list, default=None,
                   help="comma-separated KV policies (proactive, reactive, recompute, defer); "
                   "every scheduling policy runs with each (default: the scheduler's)")
    p.add_argument("--kvstore-budget", default="2GiB",
                   help="host memory of the KV store started beside the worker")
    p.add_argument("--no-kvstore", action="store_true", help="start no KV store")
    p.add_argument("--loop-ngram", type=ngram_arg, default=LOOP_NGRAM, metavar="N",
                   help=f"the worker's --loop-ngram: {LOOP_HELP}")
    p.add_argument("--scheduler-args", default="",
                   help="extra arguments for every scheduler, e.g. \"--starve-limit 1\"")
    p.add_argument("--fresh-worker", action="store_true",
                   help="restart the worker for every run, not only the scheduler")
    p.add_argument("--out-dir", default=DEFAULT_OUT_DIR,
                   help=f"plots and per-run JSON go here (default ./{DEFAULT_OUT_DIR})")
    p.add_argument("--json", default=None, metavar="OUT",
                   help="write the list of summaries (one per policy and rate)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(func=run)


class _Cluster:
    """One worker, kept across runs, and the scheduler of the current run."""

    def __init__(self, args: argparse.Namespace, model: str, max_waiting: int,
                 metrics_port: int = -1):
        self.args, self.model, self.max_waiting = args, model, max_waiting
        # The scheduler's Prometheus port (worker +1, store +2); -1 = none.
        self.metrics_port = metrics_port
        self.worker: Any = None
        self.worker_address = ""
        self.scheduler: Any = None
        self.store: Any = None
        self.store_address: str | None = None

    def _ns(self, policy: str, kv_policy: str | None) -> argparse.Namespace:
        a = self.args
        return argparse.Namespace(
            model=self.model, device=a.device, dtype=a.dtype, kv_blocks=a.kv_blocks,
            block_size=a.block_size, worker_port=0, metrics_port=self.metrics_port,
            log_level="WARNING",
            host="127.0.0.1", port=0, policy=policy, max_batch_size=a.max_batch_size,
            max_waiting=self.max_waiting, kv_policy=kv_policy,
            kvstore_budget=a.kvstore_budget, loop_ngram=getattr(a, "loop_ngram", LOOP_NGRAM))

    def start(self, policy: str, kv_policy: str | None = None) -> str:
        """A scheduler with ``policy`` (and the store and worker if they are not running);
        its address."""
        from fastserve import cli_serve

        ns = self._ns(policy, kv_policy)
        if not self.args.no_kvstore and (self.store is None or self.store.poll() is not None):
            if self.worker is not None:  # a worker must be pointed at a live store
                cli_serve.stop_child(self.worker)
                self.worker = None
            self.store, self.store_address = cli_serve.start_child(
                cli_serve.kvstore_command(ns), cli_serve.KVSTORE_READY,
                cli_serve.KVSTORE_START_TIMEOUT_S, name="kvstore")
        if self.worker is not None and (self.args.fresh_worker or self.worker.poll() is not None):
            if self.worker.poll() is not None:
                bench_serve._warn(f"the worker exited with code {self.worker.returncode}; "
                                  "starting a new one")
            cli_serve.stop_child(self.worker)
            self.worker = None
        if self.worker is None:
            self.worker, self.worker_address = cli_serve.start_child(
                cli_serve.worker_command(ns, self.store_address), cli_serve.WORKER_READY,
                cli_serve.WORKER_START_TIMEOUT_S, name="worker")
        cmd = cli_serve.scheduler_command(ns, self.worker_address)
        cmd += ["--log-level", "WARNING", *shlex.split(self.args.scheduler_args)]
        self.scheduler, address = cli_serve.start_child(
            cmd, cli_serve.SCHEDULER_READY, cli_serve.SCHEDULER_START_TIMEOUT_S,
            name=f"scheduler ({policy})")
        return address

    def procs(self) -> dict[str, Any]:
        return {"worker": self.worker, "scheduler": self.scheduler, "kvstore": self.store}

    def stop_scheduler(self) -> None:
        from fastserve import cli_serve

        if self.scheduler is not None:
            cli_serve.stop_child(self.scheduler)
            self.scheduler = None

    def close(self) -> None:
        from fastserve import cli_serve

        self.stop_scheduler()
        if self.worker is not None:
            cli_serve.stop_child(self.worker)
            self.worker = None
        if self.store is not None:
            cli_serve.stop_child(self.store)
            self.store = None


def run(args: argparse.Namespace) -> int:
    from fastserve.cli_serve import ChildFailed
    from fastserve.models import DEFAULT_MODEL, resolve_model
    from scheduler_svc.core.policies import POLICIES

    unknown = [p for p in args.policies if p not in POLICIES]
    if unknown:
        print(f"error: unknown policies {', '.join(unknown)}; the scheduler has "
              f"{', '.join(sorted(POLICIES))}", file=sys.stderr)
        return 2
    try:
        peers = peer_specs(args.peer, args.peer_cmd, args.peer_model)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if args.rounds < 1:
        print(f"error: --rounds must be at least 1, got {args.rounds}", file=sys.stderr)
        return 2
    if not args.policies and not peers:
        print("error: nothing to compare: give --policies, --peer or both", file=sys.stderr)
        return 2
    if args.loads and (args.rates or args.rate is not None):
        print("error: --loads sets the rates from the measured capacity; give it without "
              "--rate and --rates", file=sys.stderr)
        return 2
    rates: list[float | None] = list(args.rates) if args.rates else [args.rate]
    try:
        if args.loads:  # the capacity run's workload; the loads' come once it is measured
            workloads = {CAPACITY_PROBE_RATE: bench_serve.workload_from_args(
                args, CAPACITY_PROBE_RATE)}
        else:
            workloads = {rate: bench_serve.workload_from_args(args, rate) for rate in rates}
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    try:
        model = str(resolve_model(args.model or DEFAULT_MODEL, progress=True))
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    out_dir = pathlib.Path(args.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n = max(len(t) for t, _ in workloads.values())
    cluster = _Cluster(args, model, args.max_waiting or max(1024, n), metrics_port=free_port())
    summaries: list[dict[str, Any]] = []
    jcts: dict[float | None, dict[str, list[float]]] = {}
    infos = {}
    errors: list[str] = []

    def record(name: str, result: dict[str, Any], started: float, config: dict,
               rnd: int | None = None) -> None:
        summary = bench_serve.bench_summary(result, label)
        summary["policy"] = name  # the name asked for, even if Status says otherwise
        summary["scheduler_policy"] = result["policy"]
        summary["wall_s"] = time.monotonic() - started
        summary["started_at"] = time.time() - summary["wall_s"]
        summary["run_profile"] = result.get("profile")
        if rnd is not None:
            summary["round"] = config["round"] = rnd
        if rate in loads:
            summary["load"] = config["load"] = loads[rate]
        summaries.append(summary)
        jcts.setdefault(rate, {})[bench_serve.run_label(summary)] = bench_serve.jcts(
            result["requests"])
        tag = f"_r{rnd}" if rnd is not None else ""
        bench_serve.write_json(str(out_dir / f"{name}_rate{_rate_tag(rate)}{tag}.json"), {
            "summary": summary, "requests": result["requests"], "trace": info,
            "config": config})

    # Output lengths the model chose in the first run at each rate of a prompt workload: the
    # srpt-oracle policy is told them (runs after it sample the same: one seed per request).
    measured: dict[float | None, list[int | None]] = {}
    loads: dict[float | None, float] = {}  # rate -> the fraction of capacity it is
    try:
        if args.loads:
            capacity = _measure_capacity(args, cluster, *workloads[CAPACITY_PROBE_RATE],
                                         out_dir, model)
            if capacity is None:
                return 2
            rates = [round(f * capacity["capacity_req_s"], 4) for f in args.loads]
            loads = dict(zip(rates, args.loads))
            workloads = {rate: bench_serve.workload_from_args(args, rate) for rate in rates}
            if args.prompts:  # one seed per request: the same answers at every rate
                measured = dict.fromkeys(rates, capacity["output_tokens"])
        for rate, (trace, prompts) in workloads.items():
            info = infos[rate] = describe(trace)
            label = rate if rate is not None else info.get("mean_rate")
            kv_policies: list[str | None] = list(args.kv_policies or [None])
            for rnd, policy, kv_policy in schedule(args.policies, kv_policies, args.rounds):
                # One label per run: the policy, plus the KV policy when several are compared.
                name = policy if len(kv_policies) == 1 else f"{policy}+{kv_policy}"
                started = time.monotonic()
                sent = prompts
                if policy == "srpt-oracle" and args.prompts:
                    sent = _with_hints(prompts, measured.get(rate))
                try:
                    address = cluster.start(policy, kv_policy)
                    profile = RunProfile(cluster.metrics_port, cluster.procs())
                    result = bench_serve.replay(
                        address, trace, sent, timeout_s=args.timeout_s, warmup=args.warmup,
                        progress=not args.no_progress,
                        desc=f"{name} @ {bench_serve._fmt(label)} req/s")
                    result["profile"] = profile.finish()
                except (ChildFailed, ConnectionError) as e:
                    # The other runs still count; this one is reported, and the exit code is 1.
                    errors.append(f"{name} at rate {_rate_tag(rate)}: {e}")
                    bench_serve._warn(errors[-1])
                    continue
                finally:
                    cluster.stop_scheduler()
                record(name, result, started,
                       _config(args, rate, model, cluster, policy, result["status"]), rnd)
                if args.prompts and rate not in measured:
                    measured[rate] = [r["output_tokens"] if r.get("error") is None else None
                                      for r in result["requests"]]
            for peer in peers:
                started = time.monotonic()
                try:
                    result = peer.run(trace, prompts, args,
                                      desc=f"{peer.name} @ {bench_serve._fmt(label)} req/s")
                except (ConnectionError, TimeoutError, OSError) as e:
                    errors.append(f"{peer.name} at rate {_rate_tag(rate)}: {e}")
                    bench_serve._warn(errors[-1])
                    continue
                record(peer.name, result, started,
                       {**bench_serve.trace_config(args, rate), "peer": peer.name,
                        "url": peer.url, "command": peer.command, "server": result["status"]})
    finally:
        cluster.close()

    for rate in rates:
        bench_serve.print_trace_line(infos[rate], args)
    print(f"model {args.model or DEFAULT_MODEL}, device {args.device}, kv blocks "
          f"{args.kv_blocks}, max batch {args.max_batch_size or 'default'}"
          + (f", scheduler args {args.scheduler_args!r}" if args.scheduler_args else ""))
    baseline = next((s["policy"] for s in summaries if s["scheduler_policy"] == "fcfs"), None)
    if args.kv_policies and len(args.kv_policies) > 1 and "fcfs" not in args.policies:
        baseline = summaries[0]["policy"] if summaries else None  # the first KV policy
    print(bench_serve.format_table(summaries, baseline=baseline))
    if any(s.get("num_swap_outs") or s.get("num_recomputes") for s in summaries):
        print(bench_serve.format_kv_table(summaries))
    if profiles := format_profiles(summaries):
        print(profiles)
    if args.rounds > 1 and summaries:
        rows = bracketed([s for s in summaries if "round" in s], summaries[0]["policy"])
        print(format_bracketed(rows))
        bench_serve.write_json(str(out_dir / "rounds.json"), rows)
    for s in summaries:
        bench_serve.print_predictions(s)
        bench_serve.print_failures(s)
    bench_serve.write_json(str(out_dir / "summaries.json"), summaries)
    if args.json:
        bench_serve.write_json(args.json, summaries)
    if not args.no_plots and summaries:
        _plots(args, out_dir, rates, jcts, summaries)
    for error in errors:
        print(f"error: {error}", file=sys.stderr)
    return 0 if not errors and all(s["num_failed"] == 0 for s in summaries) else 1


def _measure_capacity(args: argparse.Namespace, cluster: _Cluster, trace: list,
                      prompts: list, out_dir: pathlib.Path, model: str
                      ) -> dict[str, Any] | None:
    """FCFS's capacity on this workload (every request sent at once): output tokens/s while
    requests queued, over the mean answer's length, in requests/s; written to
    ``capacity.json``. None, said why, when no request queued long enough to measure it."""
    kv_policy = (args.kv_policies or [None])[0]
    started = time.monotonic()
    try:
        address = cluster.start("fcfs", kv_policy)
        result = bench_serve.replay(
            address, trace, prompts, timeout_s=args.timeout_s, warmup=args.warmup,
            progress=not args.no_progress, desc="fcfs capacity (all at once)")
    finally:
        cluster.stop_scheduler()
    summary = bench_serve.bench_summary(result, CAPACITY_PROBE_RATE, args.capacity_min_wait)
    summary["capacity_min_wait_s"] = args.capacity_min_wait
    summary["policy"], summary["wall_s"] = "fcfs-capacity", time.monotonic() - started
    bench_serve.write_json(str(out_dir / "fcfs_capacity.json"), {
        "summary": summary, "requests": result["requests"], "trace": describe(trace),
        "config": _config(args, CAPACITY_PROBE_RATE, model, cluster, "fcfs",
                          result["status"])})
    done = [r for r in result["requests"] if r.get("error") is None]
    tokens_s = summary.get("saturated_tokens_s")
    if summary["num_failed"] or not done:
        print(f"error: the capacity run failed {summary['num_failed']} of {len(trace)} "
              f"requests ({summary.get('failures')}); see {out_dir / 'fcfs_capacity.json'}",
              file=sys.stderr)
        return None
    if not tokens_s:
        print(f"error: no request of the capacity run waited {args.capacity_min_wait:g} s in "
              f"the queue, so {len(trace)} requests do not saturate this cluster: give more "
              "requests (--num-requests), a smaller --max-batch-size or a shorter "
              "--capacity-min-wait", file=sys.stderr)
        return None
    mean_output = sum(r["output_tokens"] for r in done) / len(done)
    req_s = tokens_s / mean_output
    capacity = {
        "saturated_tokens_s": tokens_s, "saturated_window_s": summary["saturated_window_s"],
        "min_wait_s": args.capacity_min_wait,
        "mean_output_tokens": mean_output, "capacity_req_s": req_s,
        "loads": {f"{f:g}": round(f * req_s, 4) for f in args.loads},
        "num_requests": len(trace), "throughput_tokens_s": summary["throughput_tokens_s"],
        "output_tokens": [r["output_tokens"] if r.get("error") is None else None
                          for r in result["requests"]]}
    bench_serve.write_json(str(out_dir / "capacity.json"), capacity)
    print(f"capacity (fcfs, {len(trace)} requests at once): {tokens_s:.1f} output tokens/s "
          f"while requests queued ({summary['throughput_tokens_s']:.1f} over the run), "
          f"{mean_output:.0f} tokens per answer: {capacity['capacity_req_s']:.4g} req/s; "
          + ", ".join(f"load {f} -> {r:g} req/s" for f, r in capacity["loads"].items()),
          flush=True)
    return capacity


def _with_hints(prompts: list, lengths: list[int | None] | None) -> list:
    """The prompts with each answer's measured length as its hint (for srpt-oracle)."""
    if lengths is None:
        bench_serve._warn("srpt-oracle runs first at this rate, so no lengths were measured: "
                          "it ranks by the cap alone (put another policy before it)")
        return prompts
    return [dataclasses.replace(p, output_length_hint=n) for p, n in zip(prompts, lengths)]


def _rate_tag(rate: float | None) -> str:
    return "trace" if rate is None else f"{rate:g}"


def _config(args: argparse.Namespace, rate: float | None, model: str, cluster: _Cluster,
            policy: str, status: dict) -> dict[str, Any]:
    return {**bench_serve.trace_config(args, rate), "policy": policy, "model": model,
            "device": args.device, "dtype": args.dtype, "kv_blocks": args.kv_blocks,
            "block_size": args.block_size, "max_batch_size": args.max_batch_size,
            "max_waiting": cluster.max_waiting, "scheduler_args": args.scheduler_args,
            "kvstore": None if args.no_kvstore else args.kvstore_budget,
            "fresh_worker": args.fresh_worker, "loop_ngram": args.loop_ngram, "server": status}


def _plots(args: argparse.Namespace, out_dir: pathlib.Path, rates: list[float | None],
           jcts: dict[float | None, dict[str, list[float]]],
           summaries: list[dict[str, Any]]) -> None:
    try:
        from fastserve.bench import plots
    except ImportError as e:  # pragma: no cover - matplotlib is the `plot` extra
        bench_serve._warn(f"no plots ({e}); pip install 'fastserve[plot]'")
        return
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        bench_serve._warn(f"no plots ({e}); pip install 'fastserve[plot]'")
        return
    if args.prompts:
        title = (f"{pathlib.Path(args.prompts).name}, {args.num_requests or 'all'} prompts, "
                 f"at most {args.max_tokens} tokens, model {args.model or 'default'}")
    else:
        title = (f"{pathlib.Path(args.trace).name}, {args.num_requests or 'all'} requests, "
                 f"length scale {args.length_scale:g}, model {args.model or 'default'}")
    paths = [plots.plot_jct_cdf(jcts, out_dir / "jct_cdf.png", title)]
    if len(rates) > 1:
        first = [s for s in summaries if s.get("round", 1) == 1]  # a point per policy and rate
        paths.append(plots.plot_latency_vs_rate(first, out_dir / "latency_vs_rate.png",
                                                title))
    for p in paths:
        print(f"wrote {p}")
