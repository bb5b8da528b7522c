"""Helpers for the store's process tests: block data, a bare stub, the metrics port."""

from __future__ import annotations

import re

import grpc
import torch
from procs import ServiceProcess

from fastserve.proto import kvstore_pb2_grpc
from kvstore_svc.server import CHANNEL_OPTIONS

# Odd on purpose: slots are then not aligned to anything, which the copies must not mind.
BLOCK = 3 * 65536 + 11
BUDGET = 64 * BLOCK + 100


def blocks(n: int, block_bytes: int = BLOCK, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n, block_bytes), dtype=torch.uint8, generator=g)


def raw_stub(address: str) -> kvstore_pb2_grpc.KVStoreStub:
    """A bare stub: no keepalives, no validation on our side."""
    return kvstore_pb2_grpc.KVStoreStub(grpc.insecure_channel(address, options=CHANNEL_OPTIONS))


def metrics_port(store: ServiceProcess) -> int:
    found = re.search(r"metrics on :(\d+)", store.log_path.read_text())
    assert found, store.log()
    return int(found.group(1))
