"""The helm chart (helm/fastserve): `helm lint --strict` and `helm template` with the default
values and every values file in helm/fastserve/ci/, every rendered manifest validated against
the Kubernetes schemas (kubernetes-validate), and a test per template on what it renders."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess

import pytest
import yaml
from deploy_tools import tool

from scheduler_svc.core.config import SchedulerConfig

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "fastserve"
CI_VALUES = sorted((CHART / "ci").glob("*-values.yaml"))
K8S_VERSION = "1.35.0"  # the helm and kubectl deploy/tools.sh fetches speak 1.35


@pytest.fixture(scope="session")
def helm() -> str:
    return tool("helm")


def render(helm: str, *args: str, ok: bool = True) -> list[dict] | str:
    r = subprocess.run([helm, "template", "fs", str(CHART), "--namespace", "serving", *args],
                       capture_output=True, text=True, check=False)
    if not ok:
        assert r.returncode != 0, "rendering was expected to fail"
        return r.stderr
    assert r.returncode == 0, r.stderr
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def by_kind(docs: list[dict], kind: str, name: str | None = None) -> dict:
    found = [d for d in docs if d["kind"] == kind and (name is None
                                                       or d["metadata"]["name"] == name)]
    assert len(found) == 1, [(d["kind"], d["metadata"]["name"]) for d in docs]
    return found[0]


def container(workload: dict, name: str) -> dict:
    (c,) = [c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name]
    return c


@pytest.mark.parametrize("values", [None, *CI_VALUES], ids=lambda v: v.name if v else "default")
def test_lint_strict_and_every_manifest_validates(helm, values):
    import kubernetes_validate

    extra = ["-f", str(values)] if values else []
    lint = subprocess.run([helm, "lint", "--strict", str(CHART), *extra], capture_output=True,
                          text=True, check=False)
    assert lint.returncode == 0, lint.stdout + lint.stderr
    docs = render(helm, *extra)
    assert {d["kind"] for d in docs} >= {"Deployment", "StatefulSet", "Service",
                                         "ServiceAccount", "Role", "RoleBinding"}
    for doc in docs:
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):
            continue  # a CRD of prometheus-operator: not in the Kubernetes schemas
        kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_every_scheduler_setting_is_a_documented_validated_value():
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    schema = json.loads((CHART / "values.schema.json").read_text())
    config = values["scheduler"]["config"]
    props = schema["properties"]["scheduler"]["properties"]["config"]["properties"]
    fields = {f.name: f for f in dataclasses.fields(SchedulerConfig)}
    assert set(config) == set(fields) == set(props)
    defaults = SchedulerConfig()
    for name in fields:
        want = "predictive" if name == "policy" else getattr(defaults, name)  # serve's policy
        assert config[name] == want, name
        choices = fields[name].metadata.get("choices")
        if choices:
            assert sorted(props[name]["enum"]) == sorted(choices), name
    text = (CHART / "values.yaml").read_text()
    for line in text.splitlines():  # every value has a comment above it or beside it
        assert len(line) <= 100, line


def test_scheduler_deployment_passes_every_setting_and_finds_the_workers(helm):
    c = container(by_kind(render(helm), "Deployment", "fs-scheduler"), "scheduler")
    assert "--discovery=kubernetes" in c["args"] and not any(
        a.startswith("--workers=") for a in c["args"])
    assert ("--worker-selector=app.kubernetes.io/name=fastserve,app.kubernetes.io/instance=fs,"
            "app.kubernetes.io/component=worker") in c["args"]
    docs = render(helm, "--set", "workers.replicas=3", "--set", "scheduler.config.max_waiting=7",
                  "--set", "scheduler.discovery=static")
    dep = by_kind(docs, "Deployment", "fs-scheduler")
    c = container(dep, "scheduler")
    args = c["args"]
    assert args[0] == "scheduler"
    assert "--max-waiting=7" in args and "--policy=predictive" in args
    assert not any(a.startswith("--mlfq-q1-quantum-s") for a in args)  # null: the default
    workers = next(a for a in args if a.startswith("--workers=")).split("=", 1)[1].split(",")
    assert workers == [f"fs-worker-{i}.fs-worker.serving.svc:50061" for i in range(3)]
    assert "--insecure" in args
    assert c["readinessProbe"]["grpc"]["port"] == 50051
    assert "tcpSocket" in c["livenessProbe"]  # no worker is no reason to restart it
    assert c["securityContext"]["runAsNonRoot"] and not c["securityContext"][
        "allowPrivilegeEscalation"]
    http = container(dep, "http")
    assert http["readinessProbe"]["httpGet"]["path"] == "/health"
    assert "--scheduler=127.0.0.1:50051" in http["args"]
    assert dep["spec"]["template"]["spec"]["serviceAccountName"] == "fs-scheduler"
    without = render(helm, "--set", "http.enabled=false")
    names = [c["name"] for c in by_kind(without, "Deployment")["spec"]["template"]["spec"][
        "containers"]]
    assert names == ["scheduler"]


def test_scheduler_service_exposes_grpc_http_and_metrics(helm):
    svc = by_kind(render(helm), "Service", "fs")
    assert {p["name"]: p["port"] for p in svc["spec"]["ports"]} == {
        "grpc": 50051, "http": 8000, "metrics": 9400}


def test_worker_statefulset_gpu_layout_probes_and_store(helm):
    docs = render(helm, "-f", str(CHART / "ci" / "gpu-values.yaml"))
    sts = by_kind(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == 4 and sts["spec"]["serviceName"] == "fs-worker"
    spec = sts["spec"]["template"]["spec"]
    c = container(sts, "worker")
    assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"  # a quantity: a string
    assert spec["nodeSelector"] == {"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}
    assert spec["tolerations"][0]["key"] == "nvidia.com/gpu"
    assert "podAntiAffinity" in spec["affinity"]
    assert "--kvstore=$(NODE_IP):50071" in c["args"] and "--dtype=bfloat16" in c["args"]
    assert c["startupProbe"]["failureThreshold"] * c["startupProbe"]["periodSeconds"] >= 1800
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert volumes["shm"]["hostPath"]["path"] == "/dev/shm"  # the store's segment
    assert volumes["model-cache"]["persistentVolumeClaim"]["claimName"] == "model-cache"
    headless = by_kind(docs, "Service", "fs-worker")
    assert headless["spec"]["clusterIP"] == "None"
    no_store = render(helm, "--set", "kvstore.enabled=false")
    assert not [d for d in no_store if d["kind"] == "DaemonSet"]
    c = container(by_kind(no_store, "StatefulSet"), "worker")
    assert not any(a.startswith("--kvstore") for a in c["args"])
    shm = {v["name"]: v for v in by_kind(no_store, "StatefulSet")["spec"]["template"]["spec"][
        "volumes"]}["shm"]
    assert shm["emptyDir"]["medium"] == "Memory"


def test_a_tensor_parallel_group_is_one_pod_with_a_container_per_rank(helm):
    docs = render(helm, "-f", str(CHART / "ci" / "parallel-values.yaml"))
    sts = by_kind(docs, "StatefulSet")
    assert sts["spec"]["replicas"] == 2  # groups, not ranks
    containers = sts["spec"]["template"]["spec"]["containers"]
    assert [c["name"] for c in containers] == ["worker", "worker-rank1", "worker-rank2",
                                               "worker-rank3"]
    for rank, c in enumerate(containers):
        assert f"--tensor-parallel-rank={rank}" in c["args"]
        assert "--tensor-parallel-size=4" in c["args"]
        assert "--group-address=127.0.0.1:29500" in c["args"]
        assert c["resources"]["limits"]["nvidia.com/gpu"] == "1"  # a GPU per rank
        assert {"name": "shm", "mountPath": "/dev/shm"} in c["volumeMounts"]
        serves = rank == 0  # only rank 0 listens for the scheduler and has probes
        assert any(a.startswith("--listen=") for a in c["args"]) == serves
        assert ("ports" in c, "readinessProbe" in c) == (serves, serves)
    single = container(by_kind(render(helm), "StatefulSet"), "worker")
    assert not any(a.startswith("--tensor-parallel") for a in single["args"])


def test_pipeline_stages_add_a_container_per_rank_of_each_stage(helm):
    docs = render(helm, "-f", str(CHART / "ci" / "parallel-values.yaml"), "--set",
                  "workers.pipelineParallel=2")
    containers = by_kind(docs, "StatefulSet")["spec"]["template"]["spec"]["containers"]
    assert len(containers) == 8  # 4 tensor ranks in each of 2 stages, one pod
    for rank, c in enumerate(containers):
        assert f"--tensor-parallel-rank={rank % 4}" in c["args"]
        assert f"--pipeline-parallel-rank={rank // 4}" in c["args"]
        assert "--pipeline-parallel-size=2" in c["args"]
        assert any(a.startswith("--listen=") for a in c["args"]) == (rank == 0)
    staged = container(by_kind(render(helm, "--set", "workers.pipelineParallel=3"),
                              "StatefulSet"), "worker-rank2")
    assert "--tensor-parallel-rank=0" in staged["args"]
    assert "--pipeline-parallel-rank=2" in staged["args"]


def test_kvstore_budget_follows_its_memory(helm):
    docs = render(helm, "--set", "kvstore.memoryGiB=8", "--set", "kvstore.budgetReserveMiB=512")
    ds = by_kind(docs, "DaemonSet")
    c = container(ds, "kvstore")
    assert f"--budget-bytes={8 * 2**30 - 512 * 2**20}" in c["args"]
    assert c["resources"]["requests"]["memory"] == c["resources"]["limits"]["memory"] == "8Gi"
    assert c["ports"][0]["hostPort"] == 50071
    err = render(helm, "--set", "kvstore.memoryGiB=1", "--set", "kvstore.budgetReserveMiB=2048",
                 ok=False)
    assert "memoryGiB must exceed budgetReserveMiB" in err


def test_rbac_allows_reading_pods_and_nothing_else(helm):
    docs = render(helm)
    role = by_kind(docs, "Role")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"],
                              "verbs": ["get", "list", "watch"]}]
    binding = by_kind(docs, "RoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "fs-scheduler",
                                    "namespace": "serving"}]
    assert by_kind(docs, "ServiceAccount")["metadata"]["name"] == "fs-scheduler"
    assert not [d for d in render(helm, "--set", "rbac.create=false") if d["kind"] == "Role"]


def test_the_dashboard_configmap_is_the_dashboard_with_the_sidecar_label(helm):
    cm = by_kind(render(helm), "ConfigMap", "fs-dashboard")
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    want = json.loads((ROOT / "deploy" / "grafana" / "fastserve.json").read_text())
    assert json.loads(cm["data"]["fastserve.json"]) == want
    assert not [d for d in render(helm, "--set", "monitoring.grafanaDashboard.enabled=false")
                if d["kind"] == "ConfigMap"]


def test_pod_disruption_budget(helm):
    pdb = by_kind(render(helm), "PodDisruptionBudget")
    assert pdb["apiVersion"] == "policy/v1" and pdb["spec"]["minAvailable"] == 1
    old = by_kind(render(helm, "--kube-version", "1.20.2"), "PodDisruptionBudget")
    assert old["apiVersion"] == "policy/v1beta1"


def test_security_values_mount_tls_and_keys_everywhere(helm):
    docs = render(helm, "-f", str(CHART / "ci" / "security-values.yaml"))
    for kind in ("Deployment", "StatefulSet", "DaemonSet"):
        workload = by_kind(docs, kind)
        for c in workload["spec"]["template"]["spec"]["containers"]:
            assert "--tls-ca=/etc/fastserve/tls/ca.crt" in c["args"], (kind, c["name"])
            assert "--insecure" not in c["args"]
            assert {"name": "tls", "mountPath": "/etc/fastserve/tls",
                    "readOnly": True} in c["volumeMounts"]
            probe = c["readinessProbe"]  # native gRPC probes cannot speak TLS
            assert "--tls-dir=/etc/fastserve/tls" in probe["exec"]["command"], (kind, c["name"])
    sched = container(by_kind(docs, "Deployment"), "scheduler")
    assert "--api-keys=/etc/fastserve/api-keys/keys" in sched["args"]
    assert by_kind(docs, "Service", "fs")["spec"]["type"] == "LoadBalancer"


def test_old_servers_get_exec_probes(helm):
    docs = render(helm, "--kube-version", "1.20.2")
    probe = container(by_kind(docs, "StatefulSet"), "worker")["startupProbe"]
    assert probe["exec"]["command"][:3] == ["python", "-m", "fastserve.probe"]


def test_monitors_only_when_asked(helm):
    assert not [d for d in render(helm) if d["apiVersion"].startswith("monitoring.coreos")]
    docs = render(helm, "-f", str(CHART / "ci" / "monitoring-values.yaml"))
    kinds = sorted((d["kind"], d["metadata"]["name"]) for d in docs
                   if d["apiVersion"].startswith("monitoring.coreos"))
    assert kinds == [("PodMonitor", "fs-kvstore"), ("PodMonitor", "fs-worker"),
                     ("PrometheusRule", "fs"), ("ServiceMonitor", "fs-scheduler")]
    rules = yaml.safe_load((ROOT / "deploy" / "prometheus" / "fastserve-rules.yaml").read_text())
    assert by_kind(docs, "PrometheusRule")["spec"] == rules  # the same rules, unrendered
    assert "{{ $labels.worker }}" in json.dumps(by_kind(docs, "PrometheusRule")["spec"])
    sm = by_kind(docs, "ServiceMonitor")
    assert sm["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert sm["spec"]["endpoints"] == [{"port": "metrics", "interval": "10s", "relabelings": [
        {"targetLabel": "component", "replacement": "scheduler"}]}]
    pm = by_kind(docs, "PodMonitor", "fs-kvstore")
    assert pm["spec"]["podMetricsEndpoints"][0]["relabelings"][0]["replacement"] == "kvstore"


@pytest.mark.parametrize("args,words", [
    (["--set", "scheduler.config.policy=lifo"], "value must be one of"),
    (["--set", "scheduler.config.max_batch_size=0"], "minimum"),
    (["--set", "scheduler.config.no_such_setting=1"], "additional properties"),
    (["--set", "workers.pipelineParallel=0"], "minimum"),
    (["--set", "workers.tensorParallel=0"], "minimum"),
    (["--set", "workers.dtype=int3"], "value must be one of"),
])
def test_bad_values_are_refused_with_the_field(helm, args, words):
    err = render(helm, *args, ok=False)
    assert words in err, err


def test_notes_tell_how_to_send_a_first_request(helm):
    r = subprocess.run([helm, "template", "fs", str(CHART), "--namespace", "serving",
                        "--show-only", "templates/NOTES.txt"], capture_output=True, text=True,
                       check=False)
    notes = (CHART / "templates" / "NOTES.txt").read_text()
    assert "/v1/chat/completions" in notes and "port-forward" in notes
    assert r.returncode != 0 or "v1" in r.stdout  # NOTES render only on install
