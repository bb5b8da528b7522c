"""FastServe's Grafana dashboard, built here and written to ``fastserve.json`` beside this
file (``python deploy/grafana/dashboard.py``; tests/deploy checks the file is up to date and
runs every query against a real Prometheus scraping a cluster under load).

Panels are (title, unit, [(PromQL, legend)]) in reading order, two to a row; the datasource
is a dashboard variable, so the file imports into any Grafana with a Prometheus.
"""

from __future__ import annotations

import json
import pathlib
import sys

OUT = pathlib.Path(__file__).with_name("fastserve.json")
W = "[1m]"  # rate window


def quantiles(metric: str) -> list[tuple[str, str]]:
    return [(f"histogram_quantile({q}, sum by (le) (rate({metric}_bucket{W})))",
             f"p{int(q * 100)}") for q in (0.5, 0.95, 0.99)]


def mean(metric: str, by: str = "") -> str:
    grouping = f" by ({by})" if by else ""
    return (f"sum{grouping} (rate({metric}_sum{W})) / "
            f"clamp_min(sum{grouping} (rate({metric}_count{W})), 1e-9)")


PANELS: list[tuple[str, str, list[tuple[str, str]]]] = [
    ("Requests by finish reason", "reqps",
     [(f"sum by (finish_reason) (rate(fastserve:requests_total{W}))", "{{finish_reason}}")]),
    ("Refused requests by code", "reqps",
     [(f"sum by (code) (rate(fastserve:requests_refused_total{W}))", "{{code}}")]),
    ("Time to first token", "s", quantiles("fastserve:time_to_first_token_seconds")),
    ("Time per output token", "s", quantiles("fastserve:time_per_output_token_seconds")),
    ("End-to-end latency", "s", quantiles("fastserve:e2e_request_latency_seconds")),
    ("Running and waiting requests", "short",
     [("sum(fastserve:num_requests_running)", "running"),
      ("sum(fastserve:num_requests_waiting)", "waiting")]),
    ("Queue depth per level", "short",
     [("sum by (queue) (fastserve:queue_depth)", "{{queue}}")]),
    ("Demotions and promotions", "ops",
     [(f"sum(rate(fastserve:num_demotions_total{W}))", "demotions"),
      (f"sum(rate(fastserve:num_promotions_total{W}))", "promotions")]),
    ("Preemptions by kind", "ops",
     [(f"sum(rate(fastserve:num_preemptions_total{W}))", "preempted"),
      (f"sum(rate(fastserve:kv_swap_outs_total{W}))", "offloaded"),
      (f"sum(rate(fastserve:num_recomputes_total{W}))", "recomputed")]),
    ("KV usage: device and store", "percentunit",
     [("fastserve:kv_cache_usage_perc", "device {{worker}}"),
      ("fastserve:kvstore_blocks_used / clamp_min(fastserve:kvstore_blocks_capacity, 1)",
       "store {{instance}}")]),
    ("Swap bytes", "Bps",
     [(f"sum by (direction) (rate(fastserve:worker_swap_bytes_total{W}))", "{{direction}}")]),
    ("Swap wait", "s",
     [(f"sum by (worker) (rate(fastserve:kv_swap_wait_seconds_total{W}))", "{{worker}}")]),
    ("Iteration time per worker", "s",
     [(mean("fastserve:worker_step_compute_seconds", "instance"), "{{instance}}")]),
    ("Batch size", "short",
     [(mean("fastserve:iteration_batch_size"), "jobs per iteration"),
      (mean("fastserve:worker_step_batch_tokens", "instance"), "tokens {{instance}}")]),
    ("Predicted against actual output length", "short",
     [((f"sum(rate(fastserve:generation_tokens_total{W})) / "
        f"clamp_min(sum(rate(fastserve:requests_total{W})), 1e-9)"), "mean actual tokens"),
      (mean("fastserve:prediction_error_tokens"), "mean abs error of the prediction")]),
]


def build() -> dict:
    panels = []
    for i, (title, unit, targets) in enumerate(PANELS):
        panels.append({
            "id": i + 1, "type": "timeseries", "title": title,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "gridPos": {"x": 12 * (i % 2), "y": 8 * (i // 2), "w": 12, "h": 8},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
            "targets": [{"refId": chr(ord("A") + j), "expr": expr, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for j, (expr, legend) in enumerate(targets)],
        })
    return {
        "uid": "fastserve", "title": "FastServe", "tags": ["fastserve", "llm"],
        "schemaVersion": 39, "version": 1, "editable": True, "refresh": "10s",
        "time": {"from": "now-1h", "to": "now"},
        "templating": {"list": [{"name": "datasource", "type": "datasource",
                                 "query": "prometheus", "label": "Prometheus"}]},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


if __name__ == "__main__":
    OUT.write_text(render())
    print(f"wrote {OUT} ({len(PANELS)} panels)", file=sys.stderr)
