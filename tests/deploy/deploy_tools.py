"""The deployment tests' tools: found on PATH or where deploy/tools.sh and
deploy/kube-apiserver.sh cache them; a test whose tool is missing skips and says so."""

from __future__ import annotations

import os
import pathlib
import shutil

import pytest

CACHE_BIN = pathlib.Path(os.environ.get("FASTSERVE_CI_CACHE",
                                        pathlib.Path.home() / ".cache" / "fastserve-ci")) / "bin"


def tool(name: str, installer: str = "deploy/tools.sh") -> str:
    """The path of ``name``, or a skip naming what installs it."""
    found = shutil.which(name) or (str(CACHE_BIN / name) if (CACHE_BIN / name).exists()
                                   else None)
    if found is None:
        pytest.skip(f"{name} not installed: run {installer} (make test does)")
    return found
