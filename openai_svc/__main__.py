"""``python -m openai_svc --scheduler HOST:PORT [--listen 127.0.0.1:8000]``: the OpenAI HTTP
API in front of a scheduler. Prints ``http listening on HOST:PORT`` once it accepts
connections."""

from __future__ import annotations

import argparse
import asyncio
import logging
import pathlib
import socket
import sys

import grpc
import uvicorn

from fastserve.tls import is_loopback
from openai_svc.app import Backend, create_app
from openai_svc.body_limit import DEFAULT_MAX_BODY_BYTES, BodyLimit

log = logging.getLogger("openai_svc")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m openai_svc", description=__doc__)
    p.add_argument("--scheduler", default="127.0.0.1:50051", metavar="HOST:PORT",
                   help="the scheduler's gRPC address")
    p.add_argument("--listen", default="127.0.0.1:8000", metavar="HOST:PORT",
                   help="where to serve HTTP (port 0: any free port)")
    p.add_argument("--model", default=None, metavar="NAME_OR_DIR",
                   help="the served model (name or directory), for logprobs' token texts "
                        "(found in the model cache on the first such request); without it "
                        "they read 'token_id:N'")
    p.add_argument("--max-body-bytes", type=int, default=DEFAULT_MAX_BODY_BYTES,
                   help="larger request bodies are refused with 413")
    g = p.add_argument_group("transport security")
    g.add_argument("--tls-cert", default=None, metavar="PEM", help="HTTPS: this certificate")
    g.add_argument("--tls-key", default=None, metavar="PEM", help="its private key")
    g.add_argument("--scheduler-ca", default=None, metavar="PEM",
                   help="reach the scheduler over TLS, trusting this CA")
    g.add_argument("--insecure", action="store_true",
                   help="allow plain HTTP on an address other than loopback")
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if bool(args.tls_cert) != bool(args.tls_key):
        print("error: --tls-cert and --tls-key go together", file=sys.stderr)
        return 2
    if not args.tls_cert and not args.insecure and not is_loopback(args.listen):
        print(f"error: {args.listen}: plain HTTP on an address other than loopback lets anyone "
              "who reaches it in; give --tls-cert and --tls-key, or --insecure", file=sys.stderr)
        return 2
    creds = (grpc.ssl_channel_credentials(pathlib.Path(args.scheduler_ca).read_bytes())
             if args.scheduler_ca else None)
    backend = Backend(args.scheduler, creds, tokenizer_model=args.model)
    app = BodyLimit(create_app(backend), args.max_body_bytes)
    host, port = args.listen.rsplit(":", 1)
    family = socket.AF_INET6 if ":" in host.strip("[]") else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host.strip("[]"), int(port)))
    config = uvicorn.Config(app, log_level=args.log_level.lower(), access_log=False,
                            ssl_certfile=args.tls_cert, ssl_keyfile=args.tls_key,
                            timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)

    async def serve() -> None:
        task = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not task.done():  # noqa: ASYNC110 - uvicorn has no event
            await asyncio.sleep(0.05)
        if server.started:
            print(f"http listening on {host}:{sock.getsockname()[1]}", flush=True)
        await task

    asyncio.run(serve())
    return 0


if __name__ == "__main__":
    sys.exit(main())
