"""What every synchronous FastServe gRPC service does to come up (the worker, the KV store)."""

from __future__ import annotations

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from fastserve.tls import Tls, bind


def start_with_health(server: grpc.Server, address: str, service_name: str,
                      health_servicer: health.HealthServicer | None = None,
                      tls: Tls | None = None) -> int:
    """Add the standard health service to ``server``, bind ``address`` and start it; then mark
    "" and ``service_name`` SERVING. Returns the bound port; raises RuntimeError when
    ``address`` cannot be bound. Pass ``health_servicer`` to flip it to NOT_SERVING later."""
    health_servicer = health_servicer or health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    # Mutual TLS with a CA: only processes holding a cluster certificate may call.
    port = bind(server, address, tls, require_client=True)  # RuntimeError if it cannot bind
    server.start()
    for name in ("", service_name):
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return port
