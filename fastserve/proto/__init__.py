"""Generated protobuf and gRPC modules of every FastServe service.

Import them from here: ``from fastserve.proto import worker_pb2, worker_pb2_grpc``. They are
generated from ``protos/fastserve/v1/*.proto`` into ``fastserve/proto/fastserve/v1/``, which is
not committed, by the package build (``pip install .``, a wheel, or ``pip install -e .``; see
``setup.py``) and by ``make proto`` (``python -m fastserve.proto.build``) in a checkout. Any
generated module there is importable from here by its name, so a new proto needs no edit here.
"""

from __future__ import annotations

import importlib
from types import ModuleType
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from fastserve.proto.fastserve.v1 import (
        kvstore_pb2,
        kvstore_pb2_grpc,
        worker_pb2,
        worker_pb2_grpc,
    )

__all__ = ["kvstore_pb2", "kvstore_pb2_grpc", "worker_pb2", "worker_pb2_grpc"]

_GENERATED = "fastserve.proto.fastserve.v1"


# Resolved lazily (PEP 562) so that the generator, which lives in this package, can run
# before anything has been generated.
def __getattr__(name: str) -> ModuleType:
    if not name.endswith(("_pb2", "_pb2_grpc")):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    try:
        module = importlib.import_module(f"{_GENERATED}.{name}")
    except ModuleNotFoundError as e:
        if not f"{_GENERATED}.{name}".startswith(e.name or "\0"):
            raise  # something the generated module imports is missing, not the module
        raise ImportError(
            f"generated module fastserve.proto.{name} is missing: install the package "
            "(pip install ., which generates it) or, in a checkout, run `make proto` "
            "(python -m fastserve.proto.build) in the repository root"
        ) from e
    globals()[name] = module
    return module
