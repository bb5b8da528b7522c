"""What every FastServe service's Prometheus exporter shares: its registry and /metrics.

``/metrics`` always answers in Prometheus' text format (0.0.4), whatever the scraper asks
for: prometheus_client's OpenMetrics output writes ``vllm:num_requests_running`` as
``vllm_num_requests_running``, and routers and autoscalers built for vLLM look for the name
with the colon.
"""

from __future__ import annotations

import threading
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

DEFAULT_HOST = "127.0.0.1"
HOST_HELP = ("address /metrics binds (default 127.0.0.1, loopback only; 0.0.0.0 for a "
             "Prometheus on another host, e.g. scraping a pod)")


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass


class MetricsEndpoint:
    """Owns a registry (not the process-global one) and the HTTP server that exposes it."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self._server: WSGIServer | None = None

    def _app(self, environ: dict, start_response) -> list[bytes]:  # type: ignore[no-untyped-def]
        if environ.get("PATH_INFO", "/") not in ("/", "/metrics"):
            start_response("404 Not Found", [("Content-Type", "text/plain")])
            return [b"only /metrics here\n"]
        body = generate_latest(self.registry)
        start_response("200 OK", [("Content-Type", CONTENT_TYPE_LATEST),
                                  ("Content-Length", str(len(body)))])
        return [body]

    def serve(self, port: int, host: str = DEFAULT_HOST) -> int:
        """Serve ``/metrics`` over HTTP on ``host``:``port`` (0 picks one); returns the port.
        Loopback by default: metrics name models, queues and load, for the operator only."""
        server = make_server(host, port, self._app, _Server, handler_class=_QuietHandler)
        threading.Thread(target=server.serve_forever, daemon=True,
                         name="metrics-http").start()
        self._server = server
        return server.server_port

    def close(self) -> None:
        """Stop the HTTP server, if serving."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
