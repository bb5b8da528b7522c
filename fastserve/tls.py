"""Transport security for every FastServe gRPC endpoint.

| endpoint            | with ``--tls-cert/--tls-key``       | and ``--tls-ca``                     |
|---------------------|-------------------------------------|--------------------------------------|
| scheduler, clients  | TLS (clients verify the scheduler)  | -: clients prove who by API key      |
| scheduler -> worker | the scheduler presents its cert     | it trusts only workers the CA signed |
| worker, store       | TLS                                 | mutual: only callers the CA signed   |
| worker -> store     | the worker presents its cert        | it trusts only stores the CA signed  |

So with a cluster CA no process without a certificate it signed can open a worker's Step
stream, call Profile, or read, write or free a store's blocks. Without certificates an
endpoint speaks plaintext, and only on a loopback address unless ``--insecure`` says
otherwise (``check_plaintext``). ``make_local_ca`` writes a CA and one certificate for this
machine (``fastserve serve --tls-dir``).
"""

from __future__ import annotations

import argparse
import datetime
import ipaddress
import os
import pathlib
import socket
from dataclasses import dataclass
from typing import Any

import grpc

LOOPBACK = ("127.0.0.1", "localhost", "::1", "[::1]")


@dataclass(frozen=True)
class Tls:
    cert: bytes  # PEM certificate chain this process presents
    key: bytes  # its PEM private key
    ca: bytes | None  # PEM CA whose certificates this process trusts (None: system roots)

    @classmethod
    def load(cls, cert: str | None, key: str | None, ca: str | None = None) -> Tls | None:
        """From files; None when no certificate is given (plaintext)."""
        if not cert and not key:
            if ca:
                raise ValueError("--tls-ca needs --tls-cert and --tls-key too")
            return None
        if not (cert and key):
            raise ValueError("--tls-cert and --tls-key go together")
        return cls(pathlib.Path(cert).read_bytes(), pathlib.Path(key).read_bytes(),
                   pathlib.Path(ca).read_bytes() if ca else None)

    def server_credentials(self, require_client: bool) -> grpc.ServerCredentials:
        """TLS for a server; with ``require_client`` (and a CA) callers must present a
        certificate the CA signed."""
        mutual = require_client and self.ca is not None
        return grpc.ssl_server_credentials([(self.key, self.cert)],
                                           root_certificates=self.ca if mutual else None,
                                           require_client_auth=mutual)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """For calling another FastServe service: trust the CA, present this certificate."""
        return grpc.ssl_channel_credentials(root_certificates=self.ca, private_key=self.key,
                                            certificate_chain=self.cert)


def add_tls_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("transport security")
    g.add_argument("--tls-cert", default=None, metavar="PEM",
                   help="this service's certificate (chain); with --tls-key: TLS on its port")
    g.add_argument("--tls-key", default=None, metavar="PEM", help="its private key")
    g.add_argument("--tls-ca", default=None, metavar="PEM",
                   help="the cluster CA: peers must present a certificate it signed")
    g.add_argument("--insecure", action="store_true",
                   help="allow plaintext on an address other than loopback")


def tls_from_args(args: argparse.Namespace) -> Tls | None:
    """``add_tls_args``' certificates, and the plaintext rule for ``args.listen``; raises
    OSError (a file) or ValueError (a setting)."""
    tls = Tls.load(args.tls_cert, args.tls_key, args.tls_ca)
    check_plaintext(args.listen, tls, args.insecure)
    return tls


def is_loopback(address: str) -> bool:
    host = address.rsplit(":", 1)[0].strip("[]")
    if host in LOOPBACK:
        return True
    try:
        return ipaddress.ip_address(host).is_loopback  # all of 127.0.0.0/8
    except ValueError:
        return False


def check_plaintext(address: str, tls: Tls | None, insecure: bool) -> None:
    """Refuse plaintext on a non-loopback address without ``--insecure``."""
    if tls is None and not insecure and not is_loopback(address):
        raise ValueError(f"{address}: plaintext on an address other than loopback lets anyone "
                         "who reaches it in; give --tls-cert and --tls-key (and --tls-ca), or "
                         "--insecure")


def bind(server: Any, address: str, tls: Tls | None, require_client: bool) -> int:
    """Add ``address`` to ``server`` (grpc or grpc.aio), with TLS when ``tls``."""
    if tls is None:
        return server.add_insecure_port(address)
    return server.add_secure_port(address, tls.server_credentials(require_client))


def channel(address: str, tls: Tls | None, options: list | None = None,
            aio: bool = False) -> Any:
    """A channel to another FastServe service (grpc or grpc.aio)."""
    mod = grpc.aio if aio else grpc
    if tls is None:
        return mod.insecure_channel(address, options=options)
    return mod.secure_channel(address, tls.channel_credentials(), options=options)


# ---- a CA for one machine -------------------------------------------------------------------
CA_FILE = "ca.pem"


def cert_files(directory: str | pathlib.Path, name: str = "node") -> tuple[str, str]:
    """The certificate and key files ``make_local_ca`` writes for ``name``."""
    d = pathlib.Path(directory)
    return str(d / f"{name}.pem"), str(d / f"{name}-key.pem")


def make_local_ca(directory: str | pathlib.Path, names: tuple[str, ...] = ("node",),
                  days: int = 365) -> pathlib.Path:
    """Write ``ca.pem`` and, for each of ``names``, a certificate for this machine
    (``<name>.pem``, ``<name>-key.pem``: server and client use; localhost, 127.0.0.1, ::1 and
    the host name) into ``directory``, unless they are all there already. One certificate per
    process lets a store tell its workers apart (a lease serves only the certificate that
    registered it). Keys are written 0600; the CA's key is not kept, so nothing can sign
    another certificate later. Returns ``directory``."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    d = pathlib.Path(directory)
    files = [d / CA_FILE, *(pathlib.Path(f) for n in names for f in cert_files(d, n))]
    if all(f.exists() for f in files):
        return d
    d.mkdir(parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "FastServe local CA")])
    ca = (x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
          .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
          .not_valid_before(now - datetime.timedelta(minutes=5))
          .not_valid_after(now + datetime.timedelta(days=days))
          .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
          .sign(ca_key, hashes.SHA256()))
    pem = serialization.Encoding.PEM
    (d / CA_FILE).write_bytes(ca.public_bytes(pem))
    host = socket.gethostname()
    alt: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.DNSName(host),
                                   x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
                                   x509.IPAddress(ipaddress.ip_address("::1"))]
    for name in names:
        key = ec.generate_private_key(ec.SECP256R1())
        cert = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME,
                                                            f"{name}@{host}")]))
                .issuer_name(ca_name).public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(now - datetime.timedelta(minutes=5))
                .not_valid_after(now + datetime.timedelta(days=days))
                .add_extension(x509.SubjectAlternativeName(alt), critical=False)
                .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                                      ExtendedKeyUsageOID.CLIENT_AUTH]),
                               critical=False)
                .sign(ca_key, hashes.SHA256()))
        cert_file, key_file = cert_files(d, name)
        pathlib.Path(cert_file).write_bytes(cert.public_bytes(pem))
        fd = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key.private_bytes(pem, serialization.PrivateFormat.PKCS8,
                                      serialization.NoEncryption()))
    return d
