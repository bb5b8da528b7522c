"""The scheduler's Prometheus exporter: the one module that owns its Prometheus objects.

Events (an iteration done, a request finished) are pushed in by hooks on the loops and the
servicer; gauges are read at scrape time, by a custom collector, from the ``Stats``
snapshot each loop publishes after every update (never from a core another thread changes).
Metric names carry a ``fastserve:`` prefix; a few ``vllm:`` gauges repeat the fleet-wide
values under the names that routers and autoscalers built for vLLM already read.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from typing import Protocol

from prometheus_client import Counter, Gauge, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fastserve.metrics_endpoint import MetricsEndpoint
from scheduler_svc.core.contract import Stats
from scheduler_svc.core.job import Job
from scheduler_svc.loop import IterationStats

log = logging.getLogger(__name__)

# Request-level latencies, from a tiny model on a GPU (ms) to a long generation on a CPU.
LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5,
                   0.75, 1.0, 1.5, 2.0, 3.0, 5.0, 7.5, 10.0, 20.0, 40.0, 60.0, 120.0)
# One iteration or one output token: finer at the low end, where GPU decode steps live.
ITERATION_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.04, 0.05,
                     0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128, 192, 256)
PREDICTION_ERROR_BUCKETS = (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096)


class LoopView(Protocol):
    """What the exporter reads from a WorkerLoop."""

    address: str
    stats: Stats | None

    @property
    def ready(self) -> bool: ...


class SchedulerMetrics(MetricsEndpoint):
    """Prometheus metrics of one scheduler, in a registry of its own.

    Wiring: pass ``observe_iteration`` as each WorkerLoop's ``on_iteration`` and
    ``observe_finished`` as the servicer's ``on_finish``; ``bind(loops)`` once the loops
    exist; ``serve(port)`` to expose ``/metrics``.
    """

    def __init__(self, policy: str, model_name: str = ""):
        self.policy = policy
        self.model_name = model_name
        self.port: int | None = None  # set by the caller to what serve() returned
        super().__init__()
        r = self.registry
        self.requests = Counter("fastserve:requests", "Finished requests by finish reason.",
                                ["finish_reason"], registry=r)
        self.refused = Counter("fastserve:requests_refused",
                               "Requests refused before they started, by gRPC status code "
                               "(INVALID_ARGUMENT, RESOURCE_EXHAUSTED: the queue is full, "
                               "UNAUTHENTICATED, UNAVAILABLE: no worker).", ["code"], registry=r)
        self.prompt_tokens = Counter("fastserve:prompt_tokens",
                                     "Prompt tokens of finished requests.", registry=r)
        self.generation_tokens = Counter("fastserve:generation_tokens",
                                         "Generated tokens of finished requests.", registry=r)
        self.ttft = Histogram("fastserve:time_to_first_token_seconds",
                              "Arrival to first generated token.",
                              buckets=LATENCY_BUCKETS, registry=r)
        self.tpot = Histogram("fastserve:time_per_output_token_seconds",
                              "Mean time between output tokens after the first, per request.",
                              buckets=ITERATION_BUCKETS, registry=r)
        self.e2e = Histogram("fastserve:e2e_request_latency_seconds",
                             "Arrival to finish.", buckets=LATENCY_BUCKETS, registry=r)
        self.prediction_error = Histogram(
            "fastserve:prediction_error_tokens",
            "Absolute error of the predictor's first estimate of an answer's length, in tokens "
            "(requests that finished with a prediction).",
            buckets=PREDICTION_ERROR_BUCKETS, registry=r)
        self.queue_time = Histogram("fastserve:request_queue_time_seconds",
                                    "Arrival to first scheduled.",
                                    buckets=LATENCY_BUCKETS, registry=r)
        self.iteration_time = Histogram("fastserve:iteration_time_seconds",
                                        "Worker compute time of one iteration.",
                                        buckets=ITERATION_BUCKETS, registry=r)
        self.iteration_overhead = Histogram(
            "fastserve:iteration_overhead_seconds",
            "Time of one iteration spent outside worker compute (scheduling, wire, gRPC).",
            buckets=ITERATION_BUCKETS, registry=r)
        self.batch_size = Histogram("fastserve:iteration_batch_size", "Jobs in one iteration.",
                                    buckets=BATCH_SIZE_BUCKETS, registry=r)
        # By kind: "prefill" (prompt tokens only), "decode" (one token per job), "mixed", or
        # "other" (no job computed: frees and swaps only).
        self.kind_compute = Counter("fastserve:iteration_kind_compute_seconds",
                                    "Worker compute time of iterations, by kind.", ["kind"],
                                    registry=r)
        self.kind_count = Counter("fastserve:iteration_kind", "Iterations run, by kind.",
                                  ["kind"], registry=r)
        info = Gauge("fastserve:info", "Scheduler configuration (always 1).",
                     ["policy", "model"], registry=r)
        info.labels(policy=policy, model=model_name).set(1)
        self._collector = _LoopCollector(model_name)
        r.register(self._collector)

    def bind(self, loops: Sequence[LoopView]) -> None:
        """Read the gauges from these loops at every scrape (the list itself: groups that
        join later are read too)."""
        self._collector.loops = loops

    def observe_iteration(self, it: IterationStats) -> None:
        """Record one iteration (the WorkerLoop ``on_iteration`` hook)."""
        self.iteration_time.observe(it.compute_s)
        # The worker's compute is inside the round trip; clamp clock jitter below zero.
        self.iteration_overhead.observe(max(0.0, it.overhead_s + it.round_trip_s - it.compute_s))
        self.batch_size.observe(it.batch_size)
        kind = it.kind
        self.kind_compute.labels(kind=kind).inc(it.compute_s)
        self.kind_count.labels(kind=kind).inc()

    def observe_refused(self, code: str) -> None:
        """Record one refused request (the servicer ``on_refused`` hook)."""
        self.refused.labels(code=code).inc()

    def observe_finished(self, job: Job) -> None:
        """Record one finished request (the servicer ``on_finish`` hook)."""
        self.requests.labels(finish_reason=job.finish_reason or "error").inc()
        self.prompt_tokens.inc(len(job.prompt))
        self.generation_tokens.inc(len(job.output))
        if job.first_scheduled_time is not None:
            self.queue_time.observe(job.first_scheduled_time - job.arrival_time)
        if job.first_predicted_output_tokens is not None and job.finish_reason in (
                "stop", "length"):
            self.prediction_error.observe(abs(job.first_predicted_output_tokens
                                              - len(job.output)))
        if job.first_token_time is not None:
            self.ttft.observe(job.first_token_time - job.arrival_time)
        if job.finish_time is not None:
            self.e2e.observe(job.finish_time - job.arrival_time)
            n = len(job.output)
            if n > 1 and job.first_token_time is not None:
                self.tpot.observe((job.finish_time - job.first_token_time) / (n - 1))


class _LoopCollector(Collector):
    """Gauges over the bound loops, read when Prometheus scrapes."""

    def __init__(self, model_name: str):
        self.model_name = model_name
        self.loops: Sequence[LoopView] = []

    def collect(self) -> Iterator[Metric]:
        def family(name: str, doc: str, labels: Sequence[str] = ("worker",)) -> GaugeMetricFamily:
            return GaugeMetricFamily(name, doc, labels=labels)

        up = family("fastserve:worker_up", "1 while the worker's loop is connected.")
        running = family("fastserve:num_requests_running", "Requests scheduled, not finished.")
        waiting = family("fastserve:num_requests_waiting", "Requests admitted, never scheduled.")
        usage = family("fastserve:kv_cache_usage_perc", "Fraction of KV blocks in use (0..1).")
        total = family("fastserve:kv_blocks_total", "KV blocks in the worker's pool.")
        used = family("fastserve:kv_blocks_used", "KV blocks held by jobs.")
        queues = family("fastserve:queue_depth", "Jobs in each policy queue.", ("worker", "queue"))
        events = {
            "num_preemptions": CounterMetricFamily(
                "fastserve:num_preemptions",
                "Jobs that ran in one iteration and were left out of the next, unfinished.",
                labels=["worker"]),
            "num_recomputes": CounterMetricFamily(
                "fastserve:num_recomputes", "Jobs whose KV was dropped, to be recomputed.",
                labels=["worker"]),
            "num_demotions": CounterMetricFamily(
                "fastserve:num_demotions", "Jobs moved to a lower-priority queue.",
                labels=["worker"]),
            "num_promotions": CounterMetricFamily(
                "fastserve:num_promotions", "Starving jobs promoted to the top queue.",
                labels=["worker"]),
            "num_iterations": CounterMetricFamily(
                "fastserve:iterations", "Iterations run.", labels=["worker"]),
            "num_swap_outs": CounterMetricFamily(
                "fastserve:kv_swap_outs", "Jobs offloaded to the node's KV store.",
                labels=["worker"]),
            "num_swap_ins": CounterMetricFamily(
                "fastserve:kv_swap_ins", "Offloaded jobs uploaded back to the device.",
                labels=["worker"]),
            "num_kv_lost": CounterMetricFamily(
                "fastserve:kv_lost", "Swaps that failed on the worker (the job was recomputed).",
                labels=["worker"]),
            "num_predicted": CounterMetricFamily(
                "fastserve:num_predicted",
                "Finished requests whose length the worker's predictor estimated.",
                labels=["worker"]),
            "num_probes": CounterMetricFamily(
                "fastserve:num_arrival_probes",
                "Waiting requests the worker estimated from their prompts' last tokens.",
                labels=["worker"]),
            "swap_wait_s": CounterMetricFamily(
                "fastserve:kv_swap_wait_seconds",
                "Time iterations waited for their own jobs' swaps.", labels=["worker"]),
        }
        store_used = family("fastserve:kv_store_blocks_used",
                            "KV store blocks held by this worker's offloaded jobs.")
        store_total = family("fastserve:kv_store_blocks_total",
                             "KV store capacity in blocks (0: no store).")
        offloaded = family("fastserve:num_requests_offloaded",
                           "Requests whose KV is in the KV store.")
        sums = [0, 0, 0, 0]  # running, waiting, used blocks, total blocks
        for lp in self.loops:
            up.add_metric([lp.address], 1.0 if lp.ready else 0.0)
            stats = _stats(lp)
            if stats is None:
                continue
            w = [lp.address]
            running.add_metric(w, stats.num_running)
            waiting.add_metric(w, stats.num_waiting)
            usage.add_metric(w, stats.num_used_blocks / max(1, stats.num_blocks))
            total.add_metric(w, stats.num_blocks)
            used.add_metric(w, stats.num_used_blocks)
            for name, depth in stats.queues:
                queues.add_metric([lp.address, name], depth)
            for attr, fam in events.items():
                fam.add_metric(w, getattr(stats, attr))
            store_used.add_metric(w, stats.store_used_blocks)
            store_total.add_metric(w, stats.store_blocks)
            offloaded.add_metric(w, stats.num_offloaded)
            for i, v in enumerate((stats.num_running, stats.num_waiting,
                                   stats.num_used_blocks, stats.num_blocks)):
                sums[i] += v
        yield from (up, running, waiting, usage, total, used, queues, store_used, store_total,
                    offloaded, *events.values())

        m = [self.model_name]
        for name, doc, value in (
            ("vllm:num_requests_running", "Requests running, all workers.", sums[0]),
            ("vllm:num_requests_waiting", "Requests waiting, all workers.", sums[1]),
            ("vllm:kv_cache_usage_perc", "KV blocks in use over all workers (0..1).",
             sums[2] / max(1, sums[3])),
        ):
            g = GaugeMetricFamily(name, doc, labels=["model_name"])
            g.add_metric(m, value)
            yield g


def _stats(lp: LoopView) -> Stats | None:
    """A loop's last published stats snapshot, or None before it has a core."""
    return lp.stats
