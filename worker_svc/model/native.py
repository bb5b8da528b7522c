"""Native CPU kernels: C sources in ``csrc/``, compiled once per machine and loaded with ctypes.

PyTorch has no paged-attention operator for the CPU, and the well-kept kernel libraries that
do (vLLM's own, FlashInfer) are either CUDA-only or bound to their host framework's build. So
the kernels the engine needs beyond PyTorch's, decode and prefill attention read in place
from the paged pool, a linear for decode-sized row counts over a weight packed in column tiles
(which the linears' load-time timing picks only where it wins) and the decoder's elementwise
steps fused (RMSNorm with its residual add, SiLU-and-multiply, RoPE), are small C files built here
with the system C compiler (``$CC``, default ``cc``) at first use and cached under
``$FASTSERVE_CACHE_DIR/kernels`` by a hash of their sources, flags and processor. The library
is linked against ``libgomp.so.1``, the OpenMP runtime PyTorch itself loads, so it runs on
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

CSRC = pathlib.Path(__file__).with_name("csrc")
SOURCES = [CSRC / name for name in ("paged_decode_attention.c", "prefill_attention.c",
                                    "small_gemm.c", "fused_elementwise.c")]
HEADERS = [CSRC / "exp512.h"]  # included by the sources
# -ffast-math lets the compiler vectorize the dot products' reductions and call glibc's
# vector expf; the kernel uses no infinities or NaNs. It is given to the compile step only:
# linked with it, gcc adds crtfastmath.o, whose constructor flushes subnormals to zero in the
# whole process (the model's numerics included).
CFLAGS = ["-O3", "-march=native", "-ffast-math", "-fopenmp", "-fPIC"]
LDFLAGS = ["-shared", "-fopenmp", "-lm"]

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None
_tried = False


def cpu_id() -> str:
    """The processor, as far as compiled code and kernel timings depend on it."""
    try:
        text = pathlib.Path("/proc/cpuinfo").read_text()
        flags = next((ln for ln in text.splitlines() if ln.startswith(("flags", "Features"))), "")
    except OSError:
        flags = ""
    return f"{platform.machine()} {platform.processor()} {flags}"


def build_key() -> str:
    """The kernels' build: a hash of their sources, compiler, flags and processor (it names
    the cached library, and keys anything timed on these kernels)."""
    cc = os.environ.get("CC", "cc")
    return hashlib.sha256(b"\0".join([*(src.read_bytes() for src in [*SOURCES, *HEADERS]),
                                      " ".join([cc, *CFLAGS, *LDFLAGS]).encode(),
                                      cpu_id().encode()])).hexdigest()[:16]


def _build() -> ctypes.CDLL:
    from fastserve.models import cache_dir

    cc = os.environ.get("CC", "cc")
    if shutil.which(cc) is None:
        raise RuntimeError(f"no C compiler ({cc!r} not found)")
    key = build_key()
    out_dir = cache_dir() / "kernels"
    out_dir.mkdir(parents=True, exist_ok=True)
    target = out_dir / f"fastserve-kernels-{key}.so"
    if not target.exists():
        with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
            objs = [str(pathlib.Path(tmp) / f"{src.stem}.o") for src in SOURCES]
            built = pathlib.Path(tmp) / target.name
            cmds = [[cc, *CFLAGS, "-c", str(src), "-o", obj] for src, obj in zip(SOURCES, objs)]
            for cmd in [*cmds, [cc, *objs, *LDFLAGS, "-o", str(built)]]:
                proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
                if proc.returncode != 0:
                    raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[-500:]}")
            os.replace(built, target)  # atomic: concurrent builders agree on one file
    lib = ctypes.CDLL(str(target))
    ptr, i64 = ctypes.c_void_p, ctypes.c_int64
    for name, restype, argtypes in (
        ("fs_paged_decode_attention", None, [ptr] * 6 + [i64] * 7 + [ctypes.c_float]),
        ("fs_prefill_attention", ctypes.c_int, [ptr, i64, ptr, ptr, ptr, ptr] + [i64] * 7
         + [ctypes.c_float]),
        ("fs_small_gemm_packed_size", i64, [i64, i64]),
        ("fs_small_gemm_pack", None, [ptr, ptr, i64, i64]),
        ("fs_small_gemm", None, [ptr] * 4 + [i64] * 3 + [ptr]),
        ("fs_add_rms_norm", None, [ptr] * 4 + [i64] * 2 + [ctypes.c_float]),
        ("fs_silu_mul", None, [ptr] * 2 + [i64] * 2),
        ("fs_rope", None, [ptr, i64, ptr, ptr, ptr, i64, i64, i64]),
    ):
        f = getattr(lib, name)
        f.restype, f.argtypes = restype, argtypes
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


def prefill_attention(q: torch.Tensor, out: torch.Tensor, k_blocks: torch.Tensor,
                      v_blocks: torch.Tensor, block_table: torch.Tensor, ctx_len: int,
                      window: int | None, scale: float) -> bool:
    """Causal attention of one job's ``n`` new query tokens ``q`` [n, H, D] (rows may be
    strided, heads and dims contiguous) over its first ``ctx_len`` cached tokens, read in
    place from the pool, into ``out`` [n, H, D] (contiguous). False when the kernel does not
    apply (not float32 on the CPU, or not built) or could not get its scratch memory: then
    ``out`` holds nothing usable."""
    if not (q.device.type == "cpu" and q.dtype == torch.float32
            and k_blocks.dtype == torch.float32 and k_blocks.is_contiguous()
            and v_blocks.is_contiguous() and out.is_contiguous()
            and q.stride(2) == 1 and q.stride(1) == q.shape[2]):
        return False
    lib = library()
    if lib is None:
        return False
    table = block_table.to(torch.int64).contiguous()
    n, heads, dim = q.shape
    _, block_size, kv_heads, _ = k_blocks.shape
    rc = lib.fs_prefill_attention(q.data_ptr(), q.stride(0), out.data_ptr(),
                                  k_blocks.data_ptr(), v_blocks.data_ptr(), table.data_ptr(), n,
                                  ctx_len, heads, kv_heads, dim, block_size, window or 0, scale)
    return rc == 0  # -1: no scratch memory; the caller computes it another way


def small_gemm_pack(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` [N, K] packed in column tiles for ``small_gemm``, or None when the kernel
    does not apply (not float32 on the CPU, or not built)."""
    if not (weight.device.type == "cpu" and weight.dtype == torch.float32):
        return None
    lib = library()
    if lib is None:
        return None
    w = weight.contiguous()
    n, k = w.shape
    packed = torch.empty(lib.fs_small_gemm_packed_size(n, k), dtype=torch.float32)
    lib.fs_small_gemm_pack(w.data_ptr(), packed.data_ptr(), n, k)
    return packed


def small_gemm(x: torch.Tensor, packed: torch.Tensor, out_features: int,
               bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ weight.T + bias`` for a weight packed by ``small_gemm_pack``."""
    lib = _lib
    x = x.contiguous()
    rows, k = x.shape
    y = torch.empty((rows, out_features), dtype=torch.float32)
    pad = torch.empty(8 * k, dtype=torch.float32)
    b = bias.contiguous() if bias is not None else None
    lib.fs_small_gemm(x.data_ptr(), packed.data_ptr(), b.data_ptr() if b is not None else None,
                      y.data_ptr(), rows, out_features, k, pad.data_ptr())
    return y


def fused_usable(x: torch.Tensor) -> bool:
    """Whether the fused elementwise kernels below can run on ``x``: float32 on the CPU,
    contiguous, and the library built."""
    return (x.device.type == "cpu" and x.dtype == torch.float32 and x.is_contiguous()
            and library() is not None)


def add_rms_norm(x: torch.Tensor, delta: torch.Tensor | None, weight: torch.Tensor,
                 eps: float) -> torch.Tensor:
    """``x += delta`` in place (when given), then RMSNorm of ``x`` [T, D] scaled by
    ``weight``; the caller has checked ``fused_usable(x)``."""
    rows, dim = x.shape
    out = torch.empty_like(x)
    d = delta.contiguous() if delta is not None else None
    w = weight.contiguous()
    _lib.fs_add_rms_norm(x.data_ptr(), d.data_ptr() if d is not None else None, w.data_ptr(),
                         out.data_ptr(), rows, dim, eps)
    return out


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` for ``gate_up`` [T, 2I] holding gate then up; returns [T, I]."""
    rows, width = gate_up.shape
    out = gate_up.new_empty((rows, width // 2))
    _lib.fs_silu_mul(gate_up.data_ptr(), out.data_ptr(), rows, width // 2)
    return out


def rope_(x: torch.Tensor, heads: int, head_dim: int, cos: torch.Tensor, sin: torch.Tensor,
          positions: torch.Tensor) -> None:
    """Rotary embedding in place on the first ``heads`` heads of each row of ``x`` [T, W]
    (row-contiguous), from the ``[max_positions, head_dim]`` tables at ``positions``."""
    pos = positions.to(torch.int64).contiguous()
    _lib.fs_rope(x.data_ptr(), x.stride(0), cos.data_ptr(), sin.data_ptr(), pos.data_ptr(),
                 x.shape[0], heads, head_dim)
