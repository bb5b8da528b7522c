"""A free TCP port on loopback, for a child service, a rendezvous or a metrics endpoint that
must be told its port before it starts (the one copy the CLI, the benchmarks and the tests
share)."""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that nothing listens on right now (another process may still
    take it before the caller binds it)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
