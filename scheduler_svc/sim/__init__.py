"""Simulation of the scheduler on a cost model instead of a worker (pure Python, no torch).

``simulate`` runs a trace through the production ``SchedulerCore`` and policy; ``summarize``
computes the figures the real-cluster benchmark reports too; ``throughput_at_slo`` searches the
highest arrival rate that meets the paper's per-token latency SLO (``slo.py``);
``pipeline.py`` times a group's batches through its pipeline stages; ``bound.py`` gives the
highest rate any policy could sustain on a trace, beside which an SLO search is read.
"""

from scheduler_svc.sim.bound import RateBound, sustainable_rate
from scheduler_svc.sim.metrics import SUMMARY_KEYS, RequestRecord, percentile, summarize
from scheduler_svc.sim.simulator import SimResult, simulate
from scheduler_svc.sim.slo import SloPoint, SloSearch, default_slo, throughput_at_slo

__all__ = [
    "SUMMARY_KEYS", "RateBound", "RequestRecord", "SimResult", "SloPoint", "SloSearch",
    "default_slo", "percentile", "simulate", "summarize", "sustainable_rate", "throughput_at_slo",
]
