"""The package build generates the gRPC modules: a wheel built from a tree without them has
them, and they import from the installed wheel (no ``make proto``); the wheel carries the
native kernels' C sources too."""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("fastserve", "scheduler_svc", "worker_svc", "kvstore_svc")
GENERATED = "fastserve/proto/fastserve/v1"


def _fresh_tree(dest: Path) -> Path:
    """The files a build reads, as a fresh clone has them: no generated modules."""
    dest.mkdir()
    for name in ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md"):
        shutil.copy2(ROOT / name, dest / name)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", ".build-*", "fastserve.old")
    shutil.copytree(ROOT / "protos", dest / "protos", ignore=ignore)
    for package in PACKAGES:
        shutil.copytree(ROOT / package, dest / package, ignore=ignore)
    shutil.rmtree(dest / "fastserve" / "proto" / "fastserve", ignore_errors=True)
    return dest


def test_a_wheel_built_without_make_proto_has_the_grpc_modules(tmp_path):
    src = _fresh_tree(tmp_path / "src")
    dist = tmp_path / "dist"
    build = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", str(dist), str(src)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stdout + build.stderr
    (wheel,) = dist.glob("fastserve-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    for proto in ("worker", "scheduler", "kvstore"):
        assert {f"{GENERATED}/{proto}_pb2.py", f"{GENERATED}/{proto}_pb2_grpc.py"} <= names
    assert f"{GENERATED}/__init__.py" in names
    sources = {p.relative_to(ROOT).as_posix() for p in ROOT.glob("worker_svc/model/csrc/*.c")}
    assert sources and sources <= names  # the native kernels compile from them at run time
    assert not any(n.startswith(("tests/", "protos/")) for n in names)

    site = tmp_path / "site"
    install = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site),
         str(wheel)], capture_output=True, text=True, timeout=300)
    assert install.returncode == 0, install.stdout + install.stderr
    probe = ("import fastserve.proto as p\n"
             "from fastserve.proto import kvstore_pb2, scheduler_pb2_grpc, worker_pb2\n"
             "print(p.__file__)\n"
             "print(scheduler_pb2_grpc.SchedulerStub.__module__)\n")
    ran = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True,
                         text=True, timeout=60, env={"PYTHONPATH": str(site)})
    assert ran.returncode == 0, ran.stderr
    where, module = ran.stdout.split()
    assert Path(where).is_relative_to(site)
    assert module == "fastserve.proto.fastserve.v1.scheduler_pb2_grpc"
