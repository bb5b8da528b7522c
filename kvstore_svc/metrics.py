"""The store's Prometheus exporter: the one module that owns its Prometheus objects.

Transfers, refusals and expiries are pushed in by the servicer; usage gauges are read from the
pool when Prometheus scrapes, so no background thread polls it.

Both data paths are counted under ``path``: ``grpc`` (Write/Read streams, the store copies the
bytes) and ``shm`` (Seal/GetChecksums: the client copied the bytes itself, so the latency is
only the store's share of the transfer).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import Counter, Histogram
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from fastserve.metrics_endpoint import MetricsEndpoint
from kvstore_svc.pool import BlockPool

# One transfer: a Seal RPC (~100 us) to a long gRPC stream of hundreds of MB.
TRANSFER_BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                    0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class StoreMetrics(MetricsEndpoint):
    """Prometheus metrics of one store, in a registry of its own; ``serve(port)`` exposes them."""

    def __init__(self, pool: BlockPool):
        super().__init__()
        r = self.registry
        self.write_bytes = Counter("fastserve:kvstore_write_bytes",
                                   "Block bytes written into the store.", ["path"], registry=r)
        self.read_bytes = Counter("fastserve:kvstore_read_bytes",
                                  "Block bytes read from the store.", ["path"], registry=r)
        self.write_seconds = Histogram("fastserve:kvstore_write_seconds",
                                       "Store-side time of one write (Write stream or Seal).",
                                       ["path"], buckets=TRANSFER_BUCKETS, registry=r)
        self.read_seconds = Histogram("fastserve:kvstore_read_seconds",
                                      "Store-side time of one read (Read stream or "
                                      "GetChecksums).", ["path"], buckets=TRANSFER_BUCKETS,
                                      registry=r)
        self.refusals = Counter("fastserve:kvstore_allocation_refusals",
                                "Allocate calls refused because the pool was full.", registry=r)
        self.expired = Counter("fastserve:kvstore_leases_expired",
                               "Leases ended because their client stopped renewing them.",
                               registry=r)
        r.register(_PoolCollector(pool))

    def observe_write(self, path: str, num_bytes: int, seconds: float) -> None:
        self.write_bytes.labels(path=path).inc(num_bytes)
        self.write_seconds.labels(path=path).observe(seconds)

    def observe_read(self, path: str, num_bytes: int, seconds: float) -> None:
        self.read_bytes.labels(path=path).inc(num_bytes)
        self.read_seconds.labels(path=path).observe(seconds)


class _PoolCollector(Collector):
    """Usage gauges from one pool snapshot per scrape."""

    def __init__(self, pool: BlockPool):
        self.pool = pool

    def collect(self) -> Iterator[Metric]:
        s = self.pool.stats()
        for name, doc, value in (
            ("fastserve:kvstore_budget_bytes", "The store's byte budget.", s.budget_bytes),
            ("fastserve:kvstore_bytes_used", "Bytes of allocated blocks.", s.used_bytes),
            ("fastserve:kvstore_bytes_free", "Bytes of free blocks.", s.free_bytes),
            ("fastserve:kvstore_blocks_used", "Allocated blocks.", s.used_blocks),
            ("fastserve:kvstore_blocks_free", "Free blocks.", s.free_blocks),
            ("fastserve:kvstore_blocks_capacity", "Blocks in the pool (0 until sized).",
             s.capacity_blocks),
            ("fastserve:kvstore_leases", "Live leases (clients).", len(s.leases)),
        ):
            yield GaugeMetricFamily(name, doc, value=value)
