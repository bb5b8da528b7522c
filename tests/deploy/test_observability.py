"""Prometheus rules and the Grafana dashboard (deploy/): promtool's checks and unit tests, the
dashboard file up to date and well formed, and every panel's queries answered by a real
Prometheus that scrapes a running cluster (scheduler, worker, KV store) under load."""

from __future__ import annotations

import importlib.util
import json
import pathlib
import subprocess
import time

import httpx
import pytest
from deploy_tools import tool
from procs import free_port, start_kvstore, start_scheduler, start_worker

from fastserve.client import Client
from fastserve.errors import InvalidArgument

ROOT = pathlib.Path(__file__).resolve().parents[2]
RULES = ROOT / "deploy" / "prometheus" / "fastserve-rules.yaml"
DASHBOARD = ROOT / "deploy" / "grafana" / "fastserve.json"


def _dashboard_module():
    spec = importlib.util.spec_from_file_location("dashboard", DASHBOARD.with_name(
        "dashboard.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def promtool() -> str:
    return tool("promtool")


def test_rules_check_and_their_unit_tests_pass(promtool):
    check = subprocess.run([promtool, "check", "rules", str(RULES)], capture_output=True,
                           text=True, check=False)
    assert check.returncode == 0, check.stdout + check.stderr
    tests = subprocess.run([promtool, "test", "rules", RULES.with_name(
        "fastserve-rules_test.yaml").name], capture_output=True, text=True, check=False,
        cwd=RULES.parent)
    assert tests.returncode == 0, tests.stdout + tests.stderr
    import yaml

    alerts = {r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"]
              for r in g["rules"] if "alert" in r}
    tested = {t["alertname"] for case in yaml.safe_load(RULES.with_name(
        "fastserve-rules_test.yaml").read_text())["tests"] for t in case.get("alert_rule_test", [])}
    assert alerts == tested  # a test for every alert
    for g in yaml.safe_load(RULES.read_text())["groups"]:
        for r in g["rules"]:
            if "alert" in r:
                assert r["annotations"]["runbook"] and r["annotations"]["summary"], r["alert"]


def test_the_dashboard_file_is_up_to_date_and_well_formed():
    mod = _dashboard_module()
    assert DASHBOARD.read_text() == mod.render(), "run python deploy/grafana/dashboard.py"
    dash = json.loads(DASHBOARD.read_text())
    ids = [p["id"] for p in dash["panels"]]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in dash["panels"]:
        g = p["gridPos"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, p["title"]
        cells |= mine
        assert g["x"] + g["w"] <= 24
        for t in p["targets"]:
            assert t["datasource"]["uid"] == "${datasource}" and t["expr"]
    assert [v["name"] for v in dash["templating"]["list"]] == ["datasource"]


@pytest.fixture(scope="module")
def prometheus_binary() -> str:
    return tool("prometheus")


def test_every_panel_query_returns_data_from_a_real_prometheus(prometheus_binary,
                                                               tiny_tok_model, tmp_path):
    ports = {"scheduler": free_port(), "worker": free_port(), "kvstore": free_port()}
    store = start_kvstore(tmp_path, 64 << 20, "--metrics-port", str(ports["kvstore"]))
    worker = start_worker(str(tiny_tok_model), tmp_path, 256, "worker", "--kvstore",
                          store.address, "--metrics-port", str(ports["worker"]))
    sched = start_scheduler(str(tiny_tok_model), [worker.address], tmp_path, "--metrics-port",
                            str(ports["scheduler"]), "--policy", "skip-join-mlfq")
    web = free_port()
    config = tmp_path / "prometheus.yml"
    jobs = "\n".join(
        f"  - job_name: {name}\n    static_configs:\n"
        f"      - targets: ['127.0.0.1:{port}']\n        labels: {{component: {name}}}"
        for name, port in ports.items())
    config.write_text(f"global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
                      f"rule_files: ['{RULES}']\nscrape_configs:\n{jobs}\n")
    prom = subprocess.Popen([prometheus_binary, f"--config.file={config}",
                             f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{web}"],
                            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prom.log").open("w"))
    api = f"http://127.0.0.1:{web}/api/v1"
    try:
        with Client(sched.address) as client:  # load: finished, refused and long requests
            for i in range(12):
                client.generate(f"request {i} about the sea", max_tokens=8 + i,
                                temperature=0.0)
                if i % 4 == 0:
                    with pytest.raises(InvalidArgument):
                        client.generate("bad", max_tokens=4, temperature=-1.0)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    targets = httpx.get(f"{api}/targets", timeout=5).json()["data"]
                    if sum(t["health"] == "up" for t in targets["activeTargets"]) == 3:
                        break
                except httpx.HTTPError:
                    pass
                time.sleep(0.5)
            else:
                raise AssertionError((tmp_path / "prom.log").read_text()[-2000:])
            for i in range(6):  # more traffic after the first scrapes, for the rates
                client.generate(f"again {i}", max_tokens=12, temperature=0.0)
            time.sleep(3)
        rules = httpx.get(f"{api}/rules", timeout=5).json()["data"]["groups"]
        assert {g["name"] for g in rules} == {"fastserve.recording", "fastserve.alerts"}
        assert all(r["health"] != "err" for g in rules for r in g["rules"]), rules
        empty = []
        for panel in json.loads(DASHBOARD.read_text())["panels"]:
            for t in panel["targets"]:
                r = httpx.get(f"{api}/query", params={"query": t["expr"]}, timeout=10).json()
                assert r["status"] == "success", (panel["title"], t["expr"], r)
                if not r["data"]["result"]:
                    empty.append((panel["title"], t["expr"]))
        assert not empty, empty
        # The names vLLM's routers and autoscalers read arrive with their colon.
        vllm = httpx.get(f"{api}/query", params={"query": "vllm:num_requests_running"},
                         timeout=10).json()["data"]["result"]
        assert vllm and vllm[0]["metric"]["component"] == "scheduler"
    finally:
        prom.terminate()
        prom.wait(30)
        sched.stop()
        worker.stop()
        store.stop()
