"""The worker's Prometheus exporter: the one module that owns its Prometheus objects.

Steps are pushed in by the servicer's ``on_step`` hook; the KV pool and job gauges are read
from the engine when Prometheus scrapes, so no background thread polls it.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fastserve.metrics_endpoint import MetricsEndpoint
from worker_svc.engine import Engine, StepOutcome

# Swap wait of one Step: none at all (a hidden swap-in) to a reactive upload of a long job.
WAIT_BUCKETS = (0.0, 0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0,
                2.5, 10.0)
# One engine step: a tiny model's decode on a GPU (~1 ms) to a long prefill on a CPU.
STEP_BUCKETS = (0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03, 0.05, 0.075, 0.1,
                0.15, 0.2, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
TOKEN_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)


class WorkerMetrics(MetricsEndpoint):
    """Prometheus metrics of one worker, in a registry of its own.

    Pass ``observe_step`` as the servicer's ``on_step`` hook and call ``serve(port)`` to
    expose ``/metrics``.
    """

    def __init__(self, engine: Engine):
        self.engine = engine
        super().__init__()
        r = self.registry
        self.compute = Histogram("fastserve:worker_step_compute_seconds",
                                 "Engine compute time of one Step.",
                                 buckets=STEP_BUCKETS, registry=r)
        self.batch_tokens = Histogram("fastserve:worker_step_batch_tokens",
                                      "Tokens commanded in one Step.",
                                      buckets=TOKEN_BUCKETS, registry=r)
        self.steps = Counter("fastserve:worker_steps", "Steps run.", registry=r)
        self.tokens = Counter("fastserve:worker_tokens", "Tokens commanded over all Steps.",
                              registry=r)
        self.job_errors = Counter("fastserve:worker_job_errors", "Per-job errors by code.",
                                  ["code"], registry=r)
        self.swap_wait = Histogram("fastserve:worker_swap_wait_seconds",
                                   "Time one Step blocked on KV copies (swap-ins it needed, "
                                   "swap-outs still reading blocks it reused).",
                                   buckets=WAIT_BUCKETS, registry=r)
        self.swap_blocks = Counter("fastserve:worker_swap_blocks",
                                   "KV blocks copied to (out) or from (in) the KV store.",
                                   ["direction"], registry=r)
        self.swap_bytes = Counter("fastserve:worker_swap_bytes",
                                  "Bytes copied to (out) or from (in) the KV store.",
                                  ["direction"], registry=r)
        self.swap_copy = Counter("fastserve:worker_swap_copy_seconds",
                                 "Copy-thread time spent on swaps.", registry=r)
        self.swap_ins = Counter("fastserve:worker_swap_ins_consumed",
                                "Swap-ins used by a Step: hidden (done before the Step began) "
                                "or waited for.", ["overlap"], registry=r)
        self.swap_failures = Counter("fastserve:worker_swap_failures",
                                     "Failed swaps by direction and reason.",
                                     ["direction", "reason"], registry=r)
        r.register(_EngineCollector(engine))

    def observe_step(self, outcome: StepOutcome, num_tokens: int) -> None:
        """Record one Step: its outcome and the tokens it was commanded to compute."""
        self.steps.inc()
        self.tokens.inc(num_tokens)
        self.compute.observe(outcome.compute_time_s)
        self.batch_tokens.observe(num_tokens)
        for err in outcome.errors:
            self.job_errors.labels(code=err.code.name.lower()).inc()
        s = outcome.swap
        self.swap_wait.observe(outcome.swap_wait_s)
        for direction, blocks, nbytes in (("out", s.num_blocks_out, s.num_bytes_out),
                                          ("in", s.num_blocks_in, s.num_bytes_in)):
            self.swap_blocks.labels(direction=direction).inc(blocks)
            self.swap_bytes.labels(direction=direction).inc(nbytes)
        self.swap_copy.inc(s.copy_time_s)
        self.swap_ins.labels(overlap="hidden").inc(s.num_swap_ins_hidden)
        self.swap_ins.labels(overlap="waited").inc(s.num_swap_ins_waited)
        for key, count in s.failures.items():
            direction, _, reason = key.partition(":")
            self.swap_failures.labels(direction=direction, reason=reason).inc(count)


class _EngineCollector(Collector):
    """KV pool and job gauges, read when Prometheus scrapes.

    Read without the engine lock: each value is one len() of a dict, atomic under the GIL, so
    a scrape never waits for a long Step.
    """

    def __init__(self, engine: Engine):
        self.engine = engine

    def collect(self) -> Iterator[Metric]:
        pool = self.engine.pool
        for name, doc, value in (
            ("fastserve:worker_kv_blocks_used", "KV blocks held by jobs.", pool.num_used_blocks),
            ("fastserve:worker_kv_blocks_total", "KV blocks in the pool.", pool.num_blocks),
            ("fastserve:worker_jobs", "Jobs the engine holds.", len(self.engine.jobs)),
            ("fastserve:worker_jobs_offloaded", "Jobs whose KV is in the KV store.",
             self.engine.swap.num_offloaded_jobs),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
        free = self.engine.swap.store_free_blocks
        if free is not None:
            yield GaugeMetricFamily("fastserve:worker_kvstore_free_blocks",
                                    "Free blocks in the node's KV store, as last read.", value=free)
