"""``python -m openai_svc --scheduler HOST:PORT [--listen 127.0.0.1:8000]``: the OpenAI HTTP
API in front of a scheduler. Prints ``http listening on HOST:PORT`` once it accepts
connections."""

from __future__ import annotations

import argparse
import asyncio
import logging
import socket
import sys

import uvicorn

from fastserve.tls import add_tls_args, tls_from_args
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
    # As every service: --tls-cert/--tls-key serve HTTPS; --tls-ca (the cluster CA) also
    # reaches the scheduler over TLS; plain HTTP only on loopback unless --insecure.
    add_tls_args(p)
    p.add_argument("--log-level", default="INFO")
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        tls = tls_from_args(args)
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    creds = tls.channel_credentials() if tls is not None and tls.ca is not None else None
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
