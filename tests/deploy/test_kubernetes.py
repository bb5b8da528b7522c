"""Against a real kube-apiserver and etcd (deploy/kube-apiserver.sh builds and caches it):
`helm install` of the chart, and the scheduler discovering worker pods with the chart's
service-account token. There is no kubelet: the test creates the worker pods and patches
their status to Running and Ready with a pod IP on 127.0.0.x, where real worker processes
listen, as a kubelet would; deleting one mid-run moves its request to the other."""

from __future__ import annotations

import pathlib
import subprocess
import time

import grpc
import pytest
import yaml
from deploy_tools import tool
from procs import free_port, start_scheduler, start_worker
from streams import busy_worker, run

from fastserve.proto import scheduler_pb2 as spb
from fastserve.proto import scheduler_pb2_grpc

ROOT = pathlib.Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "fastserve"
NS = "serving"
SELECTOR = ("app.kubernetes.io/name=fastserve,app.kubernetes.io/instance=fs,"
            "app.kubernetes.io/component=worker")
ADMIN_TOKEN = "fastserve-test-admin-token"


def _kubeconfig(path: pathlib.Path, server: str, token: str, ca: pathlib.Path) -> pathlib.Path:
    path.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "t",
        "clusters": [{"name": "t", "cluster": {"server": server,
                                               "certificate-authority": str(ca)}}],
        "users": [{"name": "u", "user": {"token": token}}],
        "contexts": [{"name": "t", "context": {"cluster": "t", "user": "u"}}]}))
    return path


@pytest.fixture(scope="module")
def apiserver(tmp_path_factory):
    """(server URL, admin kubeconfig) of etcd + kube-apiserver on 127.0.0.1."""
    binary = tool("kube-apiserver", "deploy/kube-apiserver.sh")
    etcd = tool("etcd", "deploy/kube-apiserver.sh")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    d = tmp_path_factory.mktemp("k8s")
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    (d / "sa.key").write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                                 serialization.PrivateFormat.TraditionalOpenSSL,
                                                 serialization.NoEncryption()))
    (d / "sa.pub").write_bytes(key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    (d / "tokens.csv").write_text(f"{ADMIN_TOKEN},admin,admin,system:masters\n")
    client_port, peer_port, secure_port = free_port(), free_port(), free_port()
    etcd_proc = subprocess.Popen(
        [etcd, "--data-dir", str(d / "etcd"), "--name", "t",
         "--listen-client-urls", f"http://127.0.0.1:{client_port}",
         "--advertise-client-urls", f"http://127.0.0.1:{client_port}",
         "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
         "--initial-cluster", f"t=http://127.0.0.1:{peer_port}"],
        stdout=subprocess.DEVNULL, stderr=(d / "etcd.log").open("w"))
    issuer = "https://kubernetes.default.svc"
    api = subprocess.Popen(
        [binary, f"--etcd-servers=http://127.0.0.1:{client_port}",
         "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1",
         f"--secure-port={secure_port}", f"--cert-dir={d / 'certs'}",
         f"--token-auth-file={d / 'tokens.csv'}", "--authorization-mode=RBAC",
         f"--service-account-key-file={d / 'sa.pub'}",
         f"--service-account-signing-key-file={d / 'sa.key'}",
         f"--service-account-issuer={issuer}", f"--api-audiences={issuer}",
         "--service-cluster-ip-range=10.96.0.0/16",
         # No controller-manager here to make service-account token secrets for pods.
         "--disable-admission-plugins=ServiceAccount"],
        stdout=subprocess.DEVNULL, stderr=(d / "apiserver.log").open("w"))
    server = f"https://127.0.0.1:{secure_port}"
    ca = d / "certs" / "apiserver.crt"  # self-signed by the API server at its first start
    import httpx

    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{server}/readyz", verify=False, timeout=2,
                         headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}).text == "ok":
                break
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, (d / "apiserver.log").read_text()[-3000:]
        time.sleep(0.5)
    admin = _kubeconfig(d / "admin.kubeconfig", server, ADMIN_TOKEN, ca)
    try:
        yield server, admin, ca
    finally:
        api.terminate()
        api.wait(30)
        etcd_proc.terminate()
        etcd_proc.wait(30)


def test_helm_install_and_discovery_through_the_api_server(apiserver, tiny_tok_model,
                                                             tmp_path):
    from kubernetes import client, config

    server, admin, ca = apiserver
    r = subprocess.run([tool("helm"), "install", "fs", str(CHART), "--namespace", NS,
                        "--create-namespace", "--kubeconfig", str(admin),
                        "--set", "workers.device=cpu", "--set", "workers.replicas=2"],
                       capture_output=True, text=True, check=False, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    api = client.CoreV1Api(config.new_client_from_config(str(admin)))
    apps = client.AppsV1Api(config.new_client_from_config(str(admin)))
    assert apps.read_namespaced_stateful_set("fs-worker", NS).spec.replicas == 2
    assert apps.read_namespaced_daemon_set("fs-kvstore", NS)
    # The scheduler's identity: a token for the chart's service account.
    token = api.create_namespaced_service_account_token(
        "fs-scheduler", NS, client.AuthenticationV1TokenRequest(
            spec=client.V1TokenRequestSpec(audiences=["https://kubernetes.default.svc"]))
    ).status.token
    sa = _kubeconfig(tmp_path / "sa.kubeconfig", server, token, ca)
    sa_api = client.CoreV1Api(config.new_client_from_config(str(sa)))
    with pytest.raises(client.ApiException) as e:  # its rights end at its namespace
        sa_api.list_namespaced_pod("default")
    assert e.value.status == 403
    with pytest.raises(client.ApiException) as e:  # and at reading pods
        sa_api.list_namespaced_secret(NS)
    assert e.value.status == 403

    workers, pods = [], {}
    sched = None
    try:
        for i, host in enumerate(("127.0.0.2", "127.0.0.3")):
            port = free_port()
            workers.append(start_worker(str(tiny_tok_model), tmp_path, 256, f"k{i}",
                                        "--listen", f"{host}:{port}"))
            name = f"fs-worker-{i}"
            labels = dict(kv.split("=") for kv in SELECTOR.split(","))
            api.create_namespaced_pod(NS, client.V1Pod(
                metadata=client.V1ObjectMeta(name=name, labels=labels),
                spec=client.V1PodSpec(containers=[client.V1Container(
                    name="worker", image="fastserve:test",
                    ports=[client.V1ContainerPort(name="grpc", container_port=port)])])))
            pods[f"{host}:{port}"] = name
        sched = start_scheduler(str(tiny_tok_model), [], tmp_path, "--discovery", "kubernetes",
                                "--kubeconfig", str(sa), "--namespace", NS,
                                "--worker-selector", SELECTOR)
        with grpc.insecure_channel(sched.address) as ch:
            stub = scheduler_pb2_grpc.SchedulerStub(ch)
            assert list(stub.Status(spb.StatusRequest()).workers) == []  # nothing Ready yet
            for address, name in pods.items():  # what a kubelet would report
                api.patch_namespaced_pod_status(name, NS, {"status": {
                    "phase": "Running", "podIP": address.split(":")[0],
                    "conditions": [{"type": "Ready", "status": "True"}]}})
            deadline = time.monotonic() + 60
            while sorted(w.address for w in stub.Status(spb.StatusRequest()).workers
                         if w.state == "ready") != sorted(pods):
                assert time.monotonic() < deadline, sched.log()
                time.sleep(0.2)
            want, _ = run(stub, "reference")
            deleted = []

            def delete_midway(n):
                if n >= 100 and not deleted:
                    address = busy_worker(stub)
                    api.delete_namespaced_pod(pods[address], NS, grace_period_seconds=0)
                    deleted.append(address)

            got, final = run(stub, "victim", delete_midway)
            assert deleted and final.finish_reason == spb.FINISH_REASON_LENGTH
            assert got == want  # finished on the other worker, token for token
            left = [w.address for w in stub.Status(spb.StatusRequest()).workers]
            assert left == [a for a in pods if a != deleted[0]]
    finally:
        if sched is not None:
            sched.stop()
        for w in workers:
            w.stop()
