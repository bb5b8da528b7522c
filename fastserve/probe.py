"""``python -m fastserve.probe HOST:PORT [--service NAME] [--tls-dir DIR]``: exit 0 when the
gRPC health service at HOST:PORT reports SERVING, 1 otherwise (a Kubernetes exec probe, for
servers without native gRPC probes (before 1.24) and for ports that speak TLS, which native
probes cannot).

With ``--tls-dir`` (the chart's TLS Secret: tls.crt, tls.key, ca.crt) it presents that
certificate and checks the server's against ca.crt, under the name ``--server-name``
(default localhost: the certificate must name it, as ``fastserve serve --tls-dir``'s do).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m fastserve.probe", description=__doc__)
    p.add_argument("address")
    p.add_argument("--service", default="", help="the health service name ('': the server)")
    p.add_argument("--tls-dir", default=None)
    p.add_argument("--server-name", default="localhost")
    p.add_argument("--timeout", type=float, default=3.0)
    args = p.parse_args(argv)
    if args.tls_dir:
        d = pathlib.Path(args.tls_dir)
        creds = grpc.ssl_channel_credentials((d / "ca.crt").read_bytes(),
                                             (d / "tls.key").read_bytes(),
                                             (d / "tls.crt").read_bytes())
        channel = grpc.secure_channel(args.address, creds, options=[
            ("grpc.ssl_target_name_override", args.server_name)])
    else:
        channel = grpc.insecure_channel(args.address)
    try:
        with channel:
            r = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=args.service), timeout=args.timeout)
    except grpc.RpcError as e:
        print(f"{args.address}: {e.code().name}", file=sys.stderr)
        return 1
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(r.status)
    if r.status != health_pb2.HealthCheckResponse.SERVING:
        print(f"{args.address}: {name}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
