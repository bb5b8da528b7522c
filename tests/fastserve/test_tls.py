"""Transport security with real processes: TLS on the client API, mutual TLS inside.

A store, a worker and a scheduler run with a local CA's certificate (``make_local_ca``);
the client reaches the scheduler over TLS; a process without a certificate the CA signed
cannot open a worker's Step stream, call Profile or Describe, or touch the store; a
process with another certificate of the same CA cannot use the worker's store lease.
"""

from __future__ import annotations

import os
import pathlib
import stat

import grpc
import pytest
from procs import start_kvstore, start_scheduler, start_worker

from fastserve.client import Client
from fastserve.errors import Unavailable
from fastserve.proto import kvstore_pb2 as kpb
from fastserve.proto import kvstore_pb2_grpc, worker_pb2_grpc
from fastserve.proto import worker_pb2 as wpb
from fastserve.tls import (
    CA_FILE,
    Tls,
    cert_files,
    check_plaintext,
    make_local_ca,
)


def _flags(d, name="node"):
    cert, key = cert_files(d, name)
    return ["--tls-cert", cert, "--tls-key", key, "--tls-ca", str(d / CA_FILE)]


def test_the_local_ca_makes_its_files_once_with_a_private_key(tmp_path):
    d = make_local_ca(tmp_path / "tls")
    cert, key = cert_files(d)
    assert stat.S_IMODE(os.stat(key).st_mode) == 0o600
    before = pathlib.Path(cert).read_bytes()
    make_local_ca(d)
    assert pathlib.Path(cert).read_bytes() == before
    assert not list(d.glob("*ca-key*"))  # the CA's key is not kept


def test_plaintext_is_refused_off_loopback_without_insecure():
    check_plaintext("127.0.0.1:0", None, False)
    check_plaintext("127.0.0.2:7000", None, False)  # all of 127/8 is this machine
    check_plaintext("[::1]:7000", None, False)
    check_plaintext("0.0.0.0:50051", None, True)
    for address in ("0.0.0.0:50051", "10.0.0.5:1", "example.com:1"):
        with pytest.raises(ValueError, match="--insecure"):
            check_plaintext(address, None, False)


def test_tls_inside_and_out(tiny_tok_model, tmp_path):
    d = make_local_ca(tmp_path / "tls", ("node", "intruder"))
    other = make_local_ca(tmp_path / "other")  # a CA the cluster does not trust
    store = start_kvstore(tmp_path, 64 << 20, *_flags(d))
    worker = start_worker(str(tiny_tok_model), tmp_path, 128, "worker", "--kvstore",
                          store.address, *_flags(d))
    scheduler = None
    try:
        scheduler = start_scheduler(str(tiny_tok_model), [worker.address], tmp_path, *_flags(d))
        with Client(scheduler.address, tls_ca=str(d / CA_FILE)) as client:
            out = client.generate("count with me", max_tokens=6, temperature=0.0,
                                  ignore_eos=True)
            assert len(out.token_ids) == 6
            workers = client.status()["workers"]
            assert workers[0]["state"] == "ready"
        with Client(scheduler.address) as plain, pytest.raises(Unavailable):
            plain.generate("hi", max_tokens=2, timeout=5)

        def channels():
            mine = Tls.load(*cert_files(d), str(d / CA_FILE))
            foreign = Tls.load(*cert_files(other), str(d / CA_FILE))
            assert mine is not None and foreign is not None
            yield "plaintext", lambda a: grpc.insecure_channel(a)
            yield "no certificate", lambda a: grpc.secure_channel(
                a, grpc.ssl_channel_credentials((d / CA_FILE).read_bytes()))
            yield "another CA's certificate", lambda a: grpc.secure_channel(
                a, foreign.channel_credentials())

        for what, make in channels():
            with make(worker.address) as ch:
                w = worker_pb2_grpc.WorkerStub(ch)
                for call in (lambda w=w: w.Describe(wpb.DescribeRequest(), timeout=5),
                             lambda w=w: w.Profile(wpb.ProfileRequest(force=True), timeout=5),
                             lambda w=w: next(w.Step(iter([wpb.StepRequest()]), timeout=5))):
                    with pytest.raises(grpc.RpcError) as err:
                        call()
                    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, what
            with make(store.address) as ch:
                k = kvstore_pb2_grpc.KVStoreStub(ch)
                for call in (lambda k=k: k.Stats(kpb.StatsRequest(), timeout=5),
                             lambda k=k: k.Register(kpb.RegisterRequest(client_id="x"),
                                                    timeout=5)):
                    with pytest.raises(grpc.RpcError) as err:
                        call()
                    assert err.value.code() == grpc.StatusCode.UNAVAILABLE, what
        # The cluster's own certificate is let in (the worker's store link uses it too).
        mine = Tls.load(*cert_files(d), str(d / CA_FILE))
        assert mine is not None
        with grpc.secure_channel(store.address, mine.channel_credentials()) as ch:
            stats = kvstore_pb2_grpc.KVStoreStub(ch).Stats(kpb.StatsRequest(), timeout=5)
            assert [x.client_id for x in stats.leases] != []
        # A lease serves only the certificate that registered it, even one of the same CA.
        intruder = Tls.load(*cert_files(d, "intruder"), str(d / CA_FILE))
        assert intruder is not None
        with grpc.secure_channel(store.address, mine.channel_credentials()) as ch, \
                grpc.secure_channel(store.address, intruder.channel_credentials()) as ich:
            own, other_k = kvstore_pb2_grpc.KVStoreStub(ch), kvstore_pb2_grpc.KVStoreStub(ich)
            lease = own.Register(kpb.RegisterRequest(client_id="holder",
                                                     block_bytes=stats.block_bytes), timeout=5)
            (handle,) = own.Allocate(kpb.AllocateRequest(lease_id=lease.lease_id, job_key=1,
                                                         n=1), timeout=5).handles
            lid = lease.lease_id
            for name, call in (
                    ("KeepAlive", lambda: other_k.KeepAlive(kpb.KeepAliveRequest(lease_id=lid))),
                    ("Allocate", lambda: other_k.Allocate(kpb.AllocateRequest(lease_id=lid,
                                                                              job_key=2, n=1))),
                    ("Read", lambda: list(other_k.Read(kpb.ReadRequest(lease_id=lid,
                                                                       handles=[handle])))),
                    ("Free", lambda: other_k.Free(kpb.FreeRequest(lease_id=lid,
                                                                  handles=[handle]))),
                    ("Release", lambda: other_k.Release(kpb.ReleaseRequest(lease_id=lid)))):
                with pytest.raises(grpc.RpcError) as err:
                    call()
                assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, name
                assert "another client" in err.value.details()
            freed = own.Release(kpb.ReleaseRequest(lease_id=lid), timeout=5).num_freed
            assert freed == 1  # the holder's lease and block survived every attempt
    finally:
        if scheduler is not None:
            scheduler.stop()
        worker.stop()
        store.stop()
