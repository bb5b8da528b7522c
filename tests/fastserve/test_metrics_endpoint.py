"""Metrics bind loopback unless told otherwise (every endpoint once bound 0.0.0.0)."""

from __future__ import annotations

import socket
import urllib.request

from fastserve.metrics_endpoint import MetricsEndpoint


def _addresses():
    return {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None,
                                                      socket.AF_INET)} - {"127.0.0.1"}


def test_metrics_bind_loopback_by_default_and_the_given_host_otherwise():
    endpoint = MetricsEndpoint()
    port = endpoint.serve(0)
    try:
        assert endpoint._server.server_address[0] == "127.0.0.1"
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.status == 200
        for other in _addresses():  # not reachable on the machine's other addresses
            with socket.socket() as s:
                s.settimeout(2)
                assert s.connect_ex((other, port)) != 0
    finally:
        endpoint.close()
    endpoint = MetricsEndpoint()
    endpoint.serve(0, "0.0.0.0")
    try:
        assert endpoint._server.server_address[0] == "0.0.0.0"
    finally:
        endpoint.close()
