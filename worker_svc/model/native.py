"""Native CPU kernels: C sources in ``csrc/``, compiled once per machine and loaded with ctypes.

PyTorch has no paged-attention operator for the CPU, and the well-kept kernel libraries that
do (vLLM's own, FlashInfer) are either CUDA-only or bound to their host framework's build. So
the one kernel the engine needs, decode attention read in place from the paged pool, is a
small C file built here with the system C compiler (``$CC``, default ``cc``) at first use and
cached under ``$FASTSERVE_CACHE_DIR/kernels`` by a hash of its source, flags and processor.
It is linked against ``libgomp.so.1``, the OpenMP runtime PyTorch itself loads, so it runs on
PyTorch's own thread team (a second OpenMP runtime would start a second team that fights the
first for the cores; see worker_svc/compute_thread.py).

Anything that stops the build (no compiler, a failed compile, ``FASTSERVE_NATIVE=0``) leaves
the engine on its PyTorch path, with one warning.
"""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import threading

import torch

log = logging.getLogger(__name__)

SOURCE = pathlib.Path(__file__).with_name("csrc") / "paged_decode_attention.c"
# -ffast-math lets the compiler vectorize the dot products' reductions and call glibc's
# vector expf; the kernel uses no infinities or NaNs. It is given to the compile step only:
# linked with it, gcc adds crtfastmath.o, whose constructor flushes subnormals to zero in the
# whole process (the model's numerics included).
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC"]
LDFLAGS = ["-shared", "-fopenmp", "-lm"]

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def _cpu_id() -> str:
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
        flags = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return f"{platform.machine()} {platform.processor()} {flags}"


def _build() -> ctypes.CDLL:
    from fastserve.models import cache_dir

    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler ({cc!r} not found)")
    source = SOURCE.read_bytes()
    key = hashlib.sha256(b"\0".join([source, " ".join([cc, *CFLAGS, *LDFLAGS]).encode(),
                                     _cpu_id().encode()])).hexdigest()[:16]
    out_dir = cache_dir() / "kernels"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"paged_decode_attention-{key}.so"
    if not target.exists():
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            obj, built = pathlib.Path(tmp) / "kernel.o", pathlib.Path(tmp) / target.name
            for cmd in ([cc, *CFLAGS, "-c", str(SOURCE), "-o", str(obj)],
                        [cc, str(obj), *LDFLAGS, "-o", str(built)]):
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
            os.replace(built, target)  # atomic: concurrent builders agree on one file
    lib = ctypes.CDLL(str(target))
    f = lib.fs_paged_decode_attention
    f.restype = None
    f.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int64] * 7 + [ctypes.c_float]
    return lib


def library() -> ctypes.CDLL | None:
    """The loaded kernels, built on first call; None when they cannot be had here."""
    global _lib, _tried
    with _lock:
        if not _tried:
            _tried = True
            if os.environ.get("FASTSERVE_NATIVE", "1") == "0":
                log.info("native kernels off (FASTSERVE_NATIVE=0)")
            else:
                try:
                    _lib = _build()
                except (RuntimeError, OSError) as e:
                    log.warning("native kernels unavailable, using the PyTorch path: %s", e)
    return _lib


def paged_decode_attention(q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor,
                           block_tables: torch.Tensor, context_lens: torch.Tensor,
                           window: int | None, scale: float) -> torch.Tensor | None:
    """``[B, heads, d]`` attention of one query per job over its cached tokens, or None when
    the kernel does not apply (not float32 on the CPU, or not built)."""
    if not (q.device.type == "cpu" and q.dtype == torch.float32
            and k_blocks.dtype == torch.float32 and k_blocks.is_contiguous()
            and v_blocks.is_contiguous()):
        return None
    lib = library()
    if lib is None:
        return None
    q = q.contiguous()
    tables = block_tables.contiguous()
    lens = context_lens.contiguous()
    batch, heads, dim = q.shape
    _, block_size, kv_heads, _ = k_blocks.shape
    out = torch.empty_like(q)
    lib.fs_paged_decode_attention(
        q.data_ptr(), k_blocks.data_ptr(), v_blocks.data_ptr(), tables.data_ptr(),
        lens.data_ptr(), out.data_ptr(), batch, heads, kv_heads, dim, block_size,
        tables.shape[1], window or 0, scale)
    return out
