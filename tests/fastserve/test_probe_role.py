"""The image's entrypoint (``fastserve.role``) and its exec health probe
(``fastserve.probe``), as a pod runs them."""

from __future__ import annotations

import subprocess
import sys
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from procs import free_port

from fastserve import probe


def _run(*args):
    return subprocess.run([sys.executable, "-m", *args], capture_output=True, text=True,
                          timeout=120, check=False)


def test_each_role_runs_its_service():
    r = _run("fastserve.role")
    assert r.returncode == 2 and "scheduler,worker,kvstore,http" in r.stderr
    for role, flag in (("http", "--scheduler"), ("kvstore", "--budget-bytes")):
        r = _run("fastserve.role", role, "--help")
        assert r.returncode == 0 and flag in r.stdout, r.stderr


def test_the_probe_says_serving_not_serving_and_unreachable():
    server = grpc.server(futures.ThreadPoolExecutor(2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        servicer.set("", health_pb2.HealthCheckResponse.SERVING)
        assert probe.main([f"127.0.0.1:{port}"]) == 0
        servicer.set("", health_pb2.HealthCheckResponse.NOT_SERVING)
        assert probe.main([f"127.0.0.1:{port}"]) == 1  # a loading worker: not ready yet
    finally:
        server.stop(0)
    assert probe.main([f"127.0.0.1:{free_port()}", "--timeout", "1"]) == 1
