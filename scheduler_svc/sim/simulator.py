"""A discrete-event simulator of one worker, driving the production ``GroupCore``.

The scheduler core and the policy are the exact objects the service runs; only the worker is
replaced: each iteration "computes" its plan in the time the cost model predicts, answers every
command that completes a job's known tokens with a token, and the clock jumps to the end of the
iteration. No torch, gRPC or wall-clock time, so a trace of 100,000 requests runs in seconds to
minutes and the same inputs always give the same figures.

Event order, matching the service (``scheduler_svc/loop.py``):

| step | service                              | simulator                                    |
|------|--------------------------------------|----------------------------------------------|
| 1    | ``schedule(now)``                    | same; nothing to run: jump to next arrival   |
| 2    | worker computes; arrivals are added  | ``t = cost_model.iteration_time(...)``;      |
|      | as they come, ``add(job, arrival)``  | arrivals up to ``now + t`` added likewise    |
| 3    | ``update(plan, result, t_end)``      | ``update(plan, result, now + t)``            |

Every request is admitted (no ``max_waiting`` refusal): a benchmark client would retry, and a
refused request would silently drop out of the figures.

A group of P pipeline stages (``cost_model.pipeline_parallel``) keeps up to P plans in flight
(``config.steps_in_flight`` overrides it, as in the service), a job in at most one: a plan is
formed when the first stage is free, goes through the stages in order (``pipeline.py``: one
stage time each, ``CostModel.stage_time``), and is settled with ``update()`` when it leaves
the last, before a plan formed at the same time. With one plan in flight the loop above runs
unchanged (and fast-forwards, ``core/steady.py``); with more, events are launches and
settles in time order (no fast-forward: the core never offers a repeatable plan then).
"""

from __future__ import annotations

import functools
import gc
import math
import random
import statistics
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import ParamSpec, Protocol, TypeVar

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import StepPlan, StepResult, TokenResult
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.group import GroupCore
from scheduler_svc.core.job import Job
from scheduler_svc.core.steady import advance, window
from scheduler_svc.sim.metrics import RequestRecord, summarize
from scheduler_svc.sim.pipeline import Pipeline

P = ParamSpec("P")
R = TypeVar("R")
# The token every simulated job samples; its value is irrelevant (jobs ignore EOS).
SIM_TOKEN = 0
# Plans in a row that only free KV while jobs wait: one is normal (evictions, then the next plan
# runs on the freed blocks); more means the scheduler is stuck.
MAX_IDLE_PLANS = 3
# An estimate at arrival runs the prompt's tail through the decoder up to the predictor's
# layer: the default model's reads layer 21 of 30, so each probe token costs 22/30 of a
# prefill token (charged as prefill in the iteration that carries the probe).
PROBE_COST = 22 / 30


class RequestLike(Protocol):
    """A trace request (``fastserve.traces.TraceRequest`` or anything with these fields)."""

    @property
    def arrival_s(self) -> float: ...
    @property
    def input_tokens(self) -> int: ...
    @property
    def output_tokens(self) -> int: ...


@dataclass
class SimResult:
    """What one simulation produced: a record per completed request, plus core counters."""

    policy: str
    cost_model: str
    rate: float | None  # the offered rate the trace was generated at (None: measure it)
    records: list[RequestRecord]  # in arrival order; skipped requests have none
    num_iterations: int  # iterations that computed tokens
    num_preemptions: int
    num_skipped: int = 0  # prompt alone does not fit in max_context
    num_clipped: int = 0  # output shortened to fit in max_context
    sim_end_s: float = 0.0
    kv_policy: str = ""
    num_recomputes: int = 0
    num_swap_outs: int = 0
    num_swap_ins: int = 0
    swap_wait_s: float = 0.0  # iterations' total wait for their own jobs' uploads
    # Set when ``stop_above_s_per_token`` ended the run early: a lower bound of the mean
    # latency per token that every request would have had (``records`` is then partial).
    stopped_at_s_per_token: float | None = None

    def summary(self) -> dict:
        """``summarize()``'s keys, then the core's counters and the cost model's name."""
        out = summarize(self.records, self.policy, self.rate)
        out["kv_policy"] = self.kv_policy
        out["num_preemptions"] = self.num_preemptions
        out["num_recomputes"] = self.num_recomputes
        out["num_swap_outs"] = self.num_swap_outs
        out["num_swap_ins"] = self.num_swap_ins
        out["swap_wait_s"] = self.swap_wait_s
        out["num_iterations"] = self.num_iterations
        out["cost_model"] = self.cost_model
        return out


@dataclass(frozen=True)
class _Spec:
    arrival_s: float
    input_tokens: int
    output_tokens: int
    predicted: float | None = None


def fit_to_context(requests: Iterable[RequestLike], max_context: int,
                   predictions: Sequence[float] | None = None) -> tuple[list[_Spec], int, int]:
    """Requests sorted by arrival, clipped to ``max_context``; (specs, skipped, clipped).

    A job holds at most ``input + output`` tokens and the core finishes it at ``max_context``,
    so the output is clipped to ``max_context - input``; a prompt of ``max_context`` tokens or
    more cannot be admitted at all and is skipped.
    """
    specs, skipped, clipped = [], 0, 0
    reqs = list(requests)
    preds: Sequence[float | None] = [None] * len(reqs) if predictions is None else predictions
    if len(preds) != len(reqs):
        raise ValueError(f"{len(preds)} predictions for {len(reqs)} requests")
    for r, predicted in sorted(zip(reqs, preds, strict=True), key=lambda rp: rp[0].arrival_s):
        inp = max(1, int(r.input_tokens))
        out = max(1, int(r.output_tokens))
        if inp >= max_context:
            skipped += 1
            continue
        if inp + out > max_context:
            out = max_context - inp
            clipped += 1
        specs.append(_Spec(float(r.arrival_s), inp, out, predicted))
    return specs, skipped, clipped


def _without_gc(fn: Callable[P, R]) -> Callable[P, R]:
    """Run ``fn`` with the cyclic collector off: its full passes read every live object, and
    with a million jobs queued they took most of the run (the core makes no cycles that
    must be found while it runs; the collector runs again after)."""
    @functools.wraps(fn)
    def run(*args: P.args, **kwargs: P.kwargs) -> R:
        collecting = gc.isenabled()
        gc.disable()
        try:
            return fn(*args, **kwargs)
        finally:
            if collecting:
                gc.enable()
    return run


@_without_gc
def simulate(
    requests: Iterable[RequestLike],
    *,
    config: SchedulerConfig,
    cost_model: CostModel,
    num_blocks: int,
    block_size: int = 16,
    max_context: int | None = None,
    rate: float | None = None,
    progress: Callable[[int], None] | None = None,
    check_invariants: bool = False,
    store_blocks: int = 0,
    stop_above_s_per_token: float | None = None,
    prediction_sigma: float | None = None,
    prediction_seed: int = 0,
    predictions: Sequence[float] | None = None,
    fast_forward: bool = True,
    replicas: int = 1,
    prediction_refresh: int = 0,
    predict_at_arrival: bool = False,
    prediction_refresh_corr: float = 1.0,
    arrival_probe_error: float = 0.0,
) -> SimResult:
    """Run ``requests`` through a ``GroupCore`` with ``config.policy`` on one simulated worker
    (``replicas`` of them: each request joins the least loaded when it arrives, as the
    cluster layer places it; each has its own pool, store share and copy engine).

    ``max_context`` defaults to the whole KV pool (``num_blocks * block_size``); ``rate`` only
    labels the summary; ``progress(n)`` is told each time n more requests finish (tqdm's
    ``update``); ``check_invariants`` runs the core's block check after every iteration (slow,
    for tests); ``store_blocks`` is the node KV store's capacity for offloaded KV (0: none).

    Swaps are modelled as one copy engine beside the compute: each Step's swap-outs, then its
    swap-ins, are queued on it as the Step starts (``cost_model.swap_time``), and an iteration
    waits only for the uploads of the jobs in its own batch.

    ``prediction_sigma``: give every job a predicted output length, its true length times
    lognormal noise (``exp(N(0, sigma))``, drawn in arrival order from a generator seeded
    with ``prediction_seed``), for policies that read predictions (``predictive``); 0 is a
    perfect predictor, None gives none. ``predictions``: recorded predicted output lengths
    instead, one per request of ``requests`` in its order (a predictor's, say).
    ``prediction_refresh`` N > 0: predict as the worker's probe does (``worker_svc/predictor.py``)
    instead of once at arrival: nothing until a job's first token, then with its 1st, N+1-th,
    2N+1-th... token the tokens still to come, its true remaining times the job's own ratio
    (predicted / true length from ``prediction_sigma`` or ``predictions``), so one job's error
    keeps its sign and relative size while the estimate follows what is left.
    ``predict_at_arrival`` with it: the first prediction at arrival too, as if a predictor as
    good as the probe's first estimate read the prompt (what such a predictor would be worth).
    ``prediction_refresh_corr`` rho < 1: the error is drawn anew at each refresh instead, as an
    AR(1) in log space from the job's first one: ``e_k = rho e_(k-1) + sqrt(1 - rho^2) sigma
    N(0, 1)``, with ``sigma`` the prediction sigma (or the recorded errors' spread), the noise
    seeded by job and refresh (the same whatever the policy). The real probe's errors lie
    between: correlation 0.80 between one refresh and the next, about 0.5 at 8 apart.
    With ``prediction_refresh`` (and not ``predict_at_arrival``), a policy that ranks by
    predictions also gets estimates at arrival as the service does
    (``config.arrival_probe_tokens``, ``GroupCore._probe``: a job left out of a plan while in
    for a wait), at ``PROBE_COST`` of a prefill per tail token, its estimate the one its first
    token would bring; ``arrival_probe_error`` sigma > 0 multiplies it by ``exp(N(0, sigma))`` when
    the tail is shorter than the prompt (a tail that ranks worse than the whole prompt).

    ``cost_model`` may be split over a group (``CostModel.split``): its times are then the
    group's, and with ``pipeline_parallel`` P > 1 up to P plans are in flight per group
    (``config.steps_in_flight``, when set, instead).

    ``fast_forward``: apply runs of iterations that repeat the batch before them at once
    (``core/steady.py``); the figures are the same either way, only the time to get them
    differs.

    ``stop_above_s_per_token``: stop as soon as the mean latency per token over all requests
    is certain to exceed it. A live job's latency per token is at least (now - arrival) /
    output tokens, so finished jobs' figures plus that bound for the live ones (0 for those
    not yet arrived) is a lower bound; the SLO search ends overloaded runs this way instead of
    simulating queues that only grow.
    """
    pool_tokens = num_blocks * block_size
    if max_context is None:
        max_context = pool_tokens
    if not 2 <= max_context <= pool_tokens:
        raise ValueError(
            f"max_context must be in [2, num_blocks * block_size = {pool_tokens}], "
            f"got {max_context}: a job that cannot hold its whole context in the pool never ends"
        )
    if prediction_sigma is not None and prediction_sigma < 0:
        raise ValueError(f"prediction_sigma must be >= 0, got {prediction_sigma}")
    if prediction_sigma is not None and predictions is not None:
        raise ValueError("give prediction_sigma or predictions, not both")
    if predictions is not None and not all(p > 0 and math.isfinite(p) for p in predictions):
        raise ValueError("predictions must be finite and > 0")
    if prediction_refresh < 0:
        raise ValueError(f"prediction_refresh must be >= 0, got {prediction_refresh}")
    if prediction_refresh and prediction_sigma is None and predictions is None:
        raise ValueError("prediction_refresh needs prediction_sigma or predictions")
    if predict_at_arrival and not prediction_refresh:
        raise ValueError("predict_at_arrival is for prediction_refresh (without it every "
                         "prediction is made at arrival)")
    if not 0.0 <= prediction_refresh_corr <= 1.0:
        raise ValueError(f"prediction_refresh_corr must be in [0, 1], got "
                         f"{prediction_refresh_corr}")
    if prediction_refresh_corr < 1.0 and not prediction_refresh:
        raise ValueError("prediction_refresh_corr is for prediction_refresh (without it a job "
                         "is predicted once)")
    specs, skipped, clipped = fit_to_context(requests, max_context, predictions)
    predicted: list[float | None] = [s.predicted for s in specs]
    if prediction_sigma is not None:
        noise = random.Random(prediction_seed)
        predicted = [s.output_tokens * math.exp(noise.gauss(0.0, prediction_sigma))
                     for s in specs]
    # With refreshes: each job's predicted / true ratio, and no prediction at arrival.
    ratio = ([p / s.output_tokens if p is not None else 1.0 for p, s in zip(predicted, specs)]
             if prediction_refresh else [])
    # Errors drawn anew at each refresh: each job's last log error, and their spread.
    log_error: dict[int, float] = {}
    spread = 0.0
    if prediction_refresh_corr < 1.0:
        spread = (prediction_sigma if prediction_sigma is not None
                  else statistics.pstdev(math.log(r) for r in ratio) if len(ratio) > 1 else 0.0)
    if prediction_refresh and not predict_at_arrival:
        predicted = [None] * len(specs)
    if arrival_probe_error < 0:
        raise ValueError(f"arrival_probe_error must be >= 0, got {arrival_probe_error}")
    probing = (prediction_refresh > 0 and not predict_at_arrival
               and config.arrival_probe_tokens > 0)
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    stages = cost_model.pipeline_parallel
    depth = config.steps_in_flight or stages  # plans in flight per group, as the service's
    groups = [_Group(GroupCore(config, num_blocks, block_size, max_context,
                               cost_model=cost_model, store_blocks=store_blocks,
                               pipeline_depth=depth))
              for _ in range(replicas)]
    for g in groups:
        g.core.arrival_probes = probing and g.core.policy.ranks_by_prediction
    estimated: dict[int, list[tuple[int, float]]] = {}  # step id -> the worker's estimates
    swap_time = cost_model.swap_time
    records: list[RequestRecord | None] = [None] * len(specs)
    iteration_time = cost_model.iteration_time
    times: dict[tuple[int, int], float] = {}  # iteration_time is pure; batches repeat
    num_iterations = 0
    next_i, num_specs = 0, len(specs)
    start = specs[0].arrival_s if specs else 0.0
    for g in groups:
        g.now = start
        g.pipe = Pipeline(stages, start)
    # For stop_above_s_per_token: sum of finished jobs' latency per token, and over live jobs
    # the sums of 1/output and arrival/output (their bound at time t is t*inv - arr).
    done_per_token = live_inv = live_arr = 0.0

    prompts: dict[int, list[int]] = {}  # read-only: the core never changes a prompt

    def admit_until(t: float) -> None:
        """Every request arrived by ``t`` joins a group by the cluster layer's rule (the least
        loaded, GroupCore.load); an idle group's clock moves up to the arrival."""
        nonlocal next_i, live_inv, live_arr
        while next_i < num_specs and specs[next_i].arrival_s <= t:
            s = specs[next_i]
            prompt = prompts.get(s.input_tokens)
            if prompt is None:  # one list per length: a million prompts would not fit
                prompt = prompts[s.input_tokens] = [1] * s.input_tokens
            # It ends at its true length (max_tokens); a predictor knows only the context.
            job = Job(next_i, prompt, s.output_tokens, s.arrival_s,
                      ignore_eos=True, predicted_output_tokens=predicted[next_i],
                      length_cap=max_context - s.input_tokens)
            g = groups[0] if replicas == 1 else min(
                groups, key=lambda h: (h.core.load(), groups.index(h)))
            g.core.add(job, s.arrival_s)
            g.now = max(g.now, s.arrival_s)
            g.blocked = False
            live_inv += 1.0 / s.output_tokens
            live_arr += s.arrival_s / s.output_tokens
            next_i += 1

    def record(job: Job) -> None:
        nonlocal live_inv, live_arr, done_per_token
        s = specs[job.job_id]
        assert job.first_token_time is not None and job.finish_time is not None
        records[job.job_id] = RequestRecord(
            s.arrival_s, job.first_token_time, job.finish_time, s.input_tokens,
            len(job.output))
        live_inv -= 1.0 / s.output_tokens
        live_arr -= s.arrival_s / s.output_tokens
        done_per_token += (job.finish_time - s.arrival_s) / max(len(job.output), 1)

    def bound(t: float) -> float:
        """The mean latency per token every request is certain to exceed at time ``t``."""
        return (done_per_token + t * live_inv - live_arr) / num_specs

    def refreshed(core: GroupCore, job_id: int) -> float | None:
        """The predicted tokens still to come after the token this job samples now, when
        the probe would predict at it (``prediction_refresh``)."""
        if not prediction_refresh:
            return None
        made = len(core.jobs[job_id].output) + 1
        if (made - 1) % prediction_refresh:
            return None
        r = ratio[job_id]
        if prediction_refresh_corr < 1.0:
            k = (made - 1) // prediction_refresh
            e = math.log(r) if k == 0 else (
                prediction_refresh_corr * log_error[job_id]
                + math.sqrt(1.0 - prediction_refresh_corr ** 2) * spread
                * random.Random(prediction_seed * 1_000_003 + job_id * 65_537 + k).gauss(0, 1))
            log_error[job_id] = e
            r = math.exp(e)
        return (specs[job_id].output_tokens - made) * r

    def arrival(k: int) -> tuple[float, int]:
        """The arrival time and prompt tokens of the k-th request still to come."""
        i = next_i + k
        if i >= num_specs:
            return math.inf, 0
        s = specs[i]
        return s.arrival_s, s.input_tokens

    def before_refresh(core: GroupCore) -> int | None:
        """Iterations the last plan's batch can repeat before one of its jobs samples a
        token that is predicted at (that one goes through ``answer``); None: no bound."""
        plan = core.repeatable_plan
        if not prediction_refresh or plan is None:
            return None
        jobs, n = core.jobs, prediction_refresh
        # The next token g > made with (g - 1) % n == 0 comes in (-made) % n + 1 iterations.
        return min(((-len(job.output)) % n if (job := jobs.get(c.job_id)) is not None else 0)
                   for c in plan.commands)

    def answer(plan: StepPlan, core: GroupCore) -> tuple[list[TokenResult], float]:
        """A worker's answer to ``plan`` and its compute time: a job samples in the iteration
        that computes its last known token (the command says which); a plan of only frees
        and swaps computes nothing."""
        num_decodes = prefill_tokens = 0
        results = []
        for cmd in plan.commands:
            n = cmd.num_tokens
            if n == 1:
                num_decodes += 1
            else:
                prefill_tokens += n
            results.append(TokenResult(cmd.job_id, cmd.num_computed,
                                       SIM_TOKEN if cmd.samples else None,
                                       predicted_remaining=(refreshed(core, cmd.job_id)
                                                            if cmd.samples else None)))
        if plan.probes:
            prefill_tokens += probe(plan)
        elif not plan.commands:
            return results, 0.0
        key = (num_decodes, prefill_tokens)
        t = times.get(key)
        if t is None:
            t = times[key] = iteration_time(num_decodes, prefill_tokens)
        return results, t

    def probe(plan: StepPlan) -> int:
        """The estimates at arrival of ``plan``'s probes (kept for its result) and their cost
        in prefill tokens: each the total its first token's estimate would bring."""
        out, tokens = [], 0
        for p in plan.probes:
            jid = p.job_id
            estimate = 1.0 + (specs[jid].output_tokens - 1) * ratio[jid]
            if arrival_probe_error > 0 and len(p.token_ids) < p.prompt_tokens:
                noise = random.Random(prediction_seed * 1_000_033 + jid)
                estimate *= math.exp(noise.gauss(0.0, arrival_probe_error))
            out.append((jid, estimate))
            tokens += len(p.token_ids)
        estimated[plan.step_id] = out
        return round(tokens * PROBE_COST)

    def pipelined() -> tuple[float, float | None]:
        """The run with up to ``depth`` plans in flight per group: the next event of all
        groups, a settle (a batch left the last stage) before a launch (the first stage is
        free and a plan may be formed) at the same time. Returns (end time, stopped_at)."""
        nonlocal num_iterations
        now = start
        while True:
            best: tuple[float, bool, _Group] | None = None  # (time, launch?, group)
            for h in groups:
                settle_at = h.pipe.next_end
                launch_at = (max(h.now, h.pipe.stage_free_at(0))
                             if len(h.pipe) < depth and not h.blocked and h.core.has_work()
                             else math.inf)
                at = min(settle_at, launch_at)
                if at < math.inf and (best is None or at < best[0]):
                    best = (at, launch_at < settle_at, h)
            if best is None:
                if next_i == num_specs:
                    return now, None
                admit_until(specs[next_i].arrival_s)
                continue
            at, launch, g = best
            core = g.core
            admit_until(at)  # arrived by now, as in the service
            if not launch:
                b = g.pipe.pop()
                g.blocked = False
                num_done = 0
                result = StepResult(b.results, [], b.end - b.start, swap_wait_s=b.swap_wait_s,
                                    estimates=estimated.pop(b.plan.step_id, []))
                for u in core.update(b.plan.step_id, result, at, finished_only=True):
                    if u.finished:
                        record(u.job)
                        num_done += 1
                if check_invariants:
                    core.check_invariants()
                now = g.now = max(g.now, at)
                if progress is not None and num_done:
                    progress(num_done)
                if stop_above_s_per_token is not None and bound(at) > stop_above_s_per_token:
                    return now, bound(at)
                continue
            plan = core.schedule(at)
            if plan is None:
                if len(g.pipe):  # every job it could run is in flight: wait for a settle
                    g.blocked = True
                    continue
                if next_i == num_specs or core.kv.num_free == 0:
                    raise _stalled(core, at, config)
                g.now = max(at, specs[next_i].arrival_s)
                if replicas > 1 and g.now > at:
                    admit_until(g.now)
                continue
            # Plans that compute nothing while nothing else is in flight: see the loop below.
            stuck = not plan.commands and not plan.probes and core.jobs and not len(g.pipe)
            g.num_idle_plans = g.num_idle_plans + 1 if stuck else 0
            if g.num_idle_plans > MAX_IDLE_PLANS:
                raise _stalled(core, at, config)
            results, t = answer(plan, core)
            wait = g.swap_wait(plan, at, swap_time, block_size)
            if plan.commands:
                num_iterations += 1
            g.pipe.start(plan, results, at + wait, t / stages, wait)
            g.now = at

    stopped_at: float | None = None
    now = start
    if depth > 1:
        now, stopped_at = pipelined()
    while depth == 1:  # one plan in flight: each iteration is formed, run and settled at once
        # The group whose next iteration starts first acts (one group: always it).
        live = [g for g in groups if g.core.jobs]
        if not live:
            if next_i == num_specs:
                break
            admit_until(specs[next_i].arrival_s)
            continue
        g = min(live, key=lambda h: h.now)
        core = g.core
        now = g.now
        admit_until(now)
        plan = core.schedule(now) if core.has_work() else None
        if plan is None:
            # Nothing runs. With no free block no arrival can change that (every job needs a
            # block to compute), so waiting for one, as the service would, never ends.
            if next_i == num_specs or core.kv.num_free == 0:
                raise _stalled(core, now, config)
            g.now = max(now, specs[next_i].arrival_s)
            if replicas > 1 and g.now > now:
                admit_until(g.now)  # the next arrival may go to another group
            continue
        g.num_idle_plans = (g.num_idle_plans + 1
                            if not plan.commands and not plan.probes and core.jobs else 0)
        if g.num_idle_plans > MAX_IDLE_PLANS:
            raise _stalled(core, now, config)
        results, t = answer(plan, core)
        wait = g.swap_wait(plan, now, swap_time, block_size)
        if plan.commands:
            num_iterations += 1
        end = now + wait + t
        admit_until(end)  # arrived while the iteration ran, as in the service
        num_done = 0
        result = StepResult(results, [], t, swap_wait_s=wait,
                            estimates=estimated.pop(plan.step_id, []))
        for u in core.update(plan.step_id, result, end, finished_only=True):
            if u.finished:
                record(u.job)
                num_done += 1
        if check_invariants:
            core.check_invariants()
        now = g.now = end
        stopping = stop_above_s_per_token is not None and bound(now) > stop_above_s_per_token
        # The iterations after this one that would repeat its batch unchanged, at once (with
        # several groups, only until the next arrival or another group's next iteration).
        # With one group, every arrival comes to it: a window goes on past those its walks
        # would pass, and one window follows another while the plan still repeats (a
        # window ends, for one, at a demotion that only reorders the batch).
        while fast_forward and not stopping:
            horizon = specs[next_i].arrival_s if next_i < num_specs else math.inf
            if replicas > 1:
                horizon = min([horizon, *(h.now for h in groups if h is not g and h.core.jobs)])
            starts = window(core, t, now, horizon, SIM_TOKEN, before_refresh(core),
                            arrival if replicas == 1 else None)
            if not starts:
                break
            # Arrivals during the window are admitted as the service would, before the
            # update of the iteration they came in (only a window whose batch they cannot
            # enter has any); a run that stops at the SLO stops where step by step would.
            for j, s_j in enumerate(starts):
                end_j = s_j + t
                admit_until(end_j)
                if (stop_above_s_per_token is not None and j + 1 < len(starts)
                        and bound(end_j) > stop_above_s_per_token):
                    del starts[j + 1:]
                    break
            finished = advance(core, starts, t, SIM_TOKEN)
            for job in finished:
                record(job)
                num_done += 1
            num_iterations += len(starts)
            now = g.now = starts[-1] + t
            if check_invariants:
                core.check_invariants()
            stopping = (stop_above_s_per_token is not None
                        and bound(now) > stop_above_s_per_token)
            if finished or replicas > 1:
                break
        if progress is not None and num_done:
            progress(num_done)
        if stopping:
            stopped_at = bound(now)
            break
    done_records = [r for r in records if r is not None]
    assert stopped_at is not None or len(done_records) == num_specs, (
        f"{num_specs - len(done_records)} requests unfinished")
    cores = [g.core for g in groups]
    return SimResult(
        policy=config.policy, cost_model=cost_model.name, rate=rate, records=done_records,
        num_iterations=num_iterations, num_preemptions=sum(c.num_preemptions for c in cores),
        num_skipped=skipped, num_clipped=clipped, sim_end_s=max(now, *(g.now for g in groups)),
        kv_policy=config.kv_policy, num_recomputes=sum(c.kv.num_recomputes for c in cores),
        num_swap_outs=sum(c.kv.num_swap_outs for c in cores),
        num_swap_ins=sum(c.kv.num_swap_ins for c in cores),
        swap_wait_s=sum(c.swap_wait_s for c in cores), stopped_at_s_per_token=stopped_at,
    )


@dataclass
class _Group:
    """One simulated worker group: its core, its copy engine, its clock and its pipeline."""

    core: GroupCore
    now: float = 0.0  # when its next iteration may start
    copy_free_at: float = 0.0  # its copy engine is busy until then
    upload_done: dict[int, float] = field(default_factory=dict)  # job id -> upload complete
    num_idle_plans: int = 0  # plans in a row that computed nothing while jobs were live
    pipe: Pipeline = field(default_factory=lambda: Pipeline(1))  # its plans in flight (P > 1)
    blocked: bool = False  # no plan could be formed: wait for a settle or an arrival (P > 1)

    def swap_wait(self, plan: StepPlan, now: float, swap_time: Callable[[int, int], float],
                  block_size: int) -> float:
        """Queue ``plan``'s swap-outs, then its swap-ins, on the copy engine as the Step
        starts at ``now``; how long its compute waits for its own jobs' uploads."""
        wait = 0.0
        if plan.swap_out or plan.swap_in:
            t_copy = max(now, self.copy_free_at)
            for jid in plan.swap_out:
                t_copy += swap_time(self.core.jobs[jid].kv.stored, block_size)
            for sw in plan.swap_in:
                t_copy += swap_time(len(sw.block_ids), block_size)
                self.upload_done[sw.job_id] = t_copy
            self.copy_free_at = t_copy
        if self.upload_done:
            for cmd in plan.commands:
                done_at = self.upload_done.pop(cmd.job_id, None)
                if done_at is not None and done_at > now + wait:
                    wait = done_at - now
        return wait


def _stalled(core: GroupCore, now: float, config: SchedulerConfig) -> RuntimeError:
    alloc = core.kv.allocator
    return RuntimeError(
        f"the scheduler stalled at t={now:.3f} s: {len(core.jobs)} live jobs, none scheduled, "
        f"{alloc.num_free} of {alloc.num_blocks} blocks of {alloc.block_size} tokens free "
        f"(policy {config.policy!r})"
    )
