"""Shared fixtures: a store process per test module, and clients that close themselves."""

from __future__ import annotations

import pytest
from procs import ServiceProcess, start_kvstore
from store_helpers import BLOCK, BUDGET

from kvstore_svc.client import KVStoreClient


@pytest.fixture(scope="module")
def logs(tmp_path_factory):
    return tmp_path_factory.mktemp("kvstore-logs")


@pytest.fixture(scope="module")
def store(logs):
    s = start_kvstore(logs, BUDGET, "--metrics-port", "0", "--log-level", "DEBUG")
    yield s
    assert s.stop() == 0, s.log()


@pytest.fixture
def connect():
    """``connect(store, **kwargs)``: a KVStoreClient for BLOCK-byte blocks, closed at teardown."""
    clients: list[KVStoreClient] = []

    def make(store: ServiceProcess, **kwargs) -> KVStoreClient:
        kwargs = {"client_id": "test", "block_bytes": BLOCK, "timeout_s": 5.0, **kwargs}
        clients.append(KVStoreClient(store.address, **kwargs))
        return clients[-1]

    yield make
    for c in clients:
        c.close()
