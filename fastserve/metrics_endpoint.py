"""What every FastServe service's Prometheus exporter shares: its registry and /metrics."""

from __future__ import annotations

from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

DEFAULT_HOST = "127.0.0.1"
HOST_HELP = ("address /metrics binds (default 127.0.0.1, loopback only; 0.0.0.0 for a "
             "Prometheus on another host, e.g. scraping a pod)")


class MetricsEndpoint:
    """Owns a registry (not the process-global one) and the HTTP server that exposes it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server: WSGIServer | None = None

    def serve(self, port: int, host: str = DEFAULT_HOST) -> int:
        """Serve ``/metrics`` over HTTP on ``host``:``port`` (0 picks one); returns the port.
        Loopback by default: metrics name models, queues and load, for the operator only."""
        server, _ = start_http_server(port, addr=host, registry=self.registry)
        self._server = server
        return server.server_port

    def close(self) -> None:
        """Stop the HTTP server, if serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
