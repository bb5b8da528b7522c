"""The package build generates the gRPC modules (``fastserve/proto/fastserve/``) from
``protos/``, so that ``pip install .`` and a built wheel need no ``make proto`` step.

Everything else about the package is in ``pyproject.toml``. The generator is
``fastserve/proto/build.py`` (``python -m fastserve.proto.build``, ``make proto``), loaded by
path: the package itself is not importable before it is built. A wheel gets the modules in its
build directory; an editable install (``pip install -e .``) gets them in the source tree, where
its imports find them. ``grpcio-tools`` is a build requirement for this.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
GENERATED = Path("fastserve", "proto", "fastserve")


def _generator():  # -> the fastserve/proto/build.py module
    spec = importlib.util.spec_from_file_location("_fastserve_proto_build",
                                                  ROOT / "fastserve" / "proto" / "build.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class BuildPyWithProtos(build_py):
    """``build_py``, then protoc on ``protos/`` into the built (or, editable, the source)
    ``fastserve/proto/fastserve/``."""

    def run(self) -> None:
        super().run()
        out = ROOT / GENERATED if self.editable_mode else Path(self.build_lib) / GENERATED
        out.parent.mkdir(parents=True, exist_ok=True)
        written = _generator().build(ROOT / "protos", out)
        self.announce(f"generated {len(written)} files in {out}", level=2)


setup(cmdclass={"build_py": BuildPyWithProtos})
