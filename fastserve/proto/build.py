"""Generate the Python protobuf and gRPC modules: ``python -m fastserve.proto.build``.

Runs ``grpc_tools.protoc`` on ``protos/fastserve/v1/*.proto`` into ``fastserve/proto/fastserve/``
(gitignored; never edit it by hand), then rewrites the generated imports. protoc names a
module by its proto path, so ``worker_pb2_grpc.py`` says ``from fastserve.v1 import
worker_pb2``; we ship the modules under ``fastserve.proto.fastserve.v1`` instead (protoc has no
import-prefix option), so every ``from fastserve.vN...`` import gets that prefix. The rewrite
is the only change and is reproducible; output is built in a temporary directory and swapped
in, so a failed run leaves the previous modules intact and removed protos leave nothing behind.
"""

from __future__ import annotations

import re
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROTO_ROOT = ROOT / "protos"
PACKAGE_DIR = Path(__file__).resolve().parent
OUT = PACKAGE_DIR / "fastserve"
IMPORT_PREFIX = "fastserve.proto."

# `from fastserve.v1 import x_pb2` and `import fastserve.v1.x_pb2` forms, protoc's and mypy's.
_IMPORT = re.compile(r"^(\s*)(from|import) (fastserve\.v\d+\b)", re.MULTILINE)


def rewrite_imports(source: str) -> str:
    """Prefix imports of generated ``fastserve.vN`` modules with ``fastserve.proto.``."""
    return _IMPORT.sub(lambda m: f"{m[1]}{m[2]} {IMPORT_PREFIX}{m[3]}", source)


def build(proto_root: Path = PROTO_ROOT, out: Path = OUT) -> list[Path]:
    """Regenerate every module under ``out`` from ``proto_root``; return the files written."""
    from grpc_tools import protoc

    protos = sorted(proto_root.glob("fastserve/v*/*.proto"))
    if not protos:
        raise SystemExit(f"no .proto files under {proto_root}/fastserve/v*/")
    include = Path(protoc.__file__).parent / "_proto"  # google/protobuf/*.proto
    tmp = Path(tempfile.mkdtemp(prefix=".build-", dir=out.parent))
    try:
        args = [
            "grpc_tools.protoc",
            f"-I{proto_root}",
            f"-I{include}",
            f"--python_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--pyi_out={tmp}",
            *(str(p) for p in protos),
        ]
        if protoc.main(args) != 0:
            raise SystemExit(f"protoc failed: {' '.join(args)}")
        generated = tmp / "fastserve"
        for path in sorted(generated.rglob("*.py*")):
            path.write_text(rewrite_imports(path.read_text()))
        for d in [generated, *(p for p in generated.rglob("*") if p.is_dir())]:
            (d / "__init__.py").write_text("")
        old = out.with_name(out.name + ".old")
        shutil.rmtree(old, ignore_errors=True)
        if out.exists():
            out.rename(old)
        generated.rename(out)
        shutil.rmtree(old, ignore_errors=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return sorted(p for p in out.rglob("*") if p.is_file())


def main() -> None:
    written = build()
    for path in written:
        print(path.relative_to(ROOT), file=sys.stderr)


if __name__ == "__main__":
    main()
