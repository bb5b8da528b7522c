"""Paged decode attention, the default model's shape (9 heads, 3 KV heads, size 64, blocks of
16), 30 layers of a pool whose blocks are scattered at random: the native kernel of this tree
against the one of another revision, alternated run by run (median of 6 runs of 5 passes).

    python docs/bench-fused/decode_attention.py JOBS CONTEXT [--against REV]

Without ``--against`` it times this tree's kernel alone. THP_MEM_ALLOC_ENABLE=1 puts the pool
in 2 MB pages, as the worker does.
"""

from __future__ import annotations

import argparse
import ctypes
import pathlib
import subprocess
import tempfile
import time

import torch

from worker_svc.model import native

HEADS, KV_HEADS, DIM, BLOCK, LAYERS, NUM_BLOCKS = 9, 3, 64, 16, 30, 4096
SOURCE = "worker_svc/model/csrc/paged_decode_attention.c"


def build(source: str, out: pathlib.Path) -> ctypes.CDLL:
    """Compile one revision's kernel (with this tree's headers)."""
    src = out.with_suffix(".c")
    src.write_text(source)
    subprocess.run(["cc", *native.CFLAGS, "-I", str(native.CSRC), str(src), *native.LDFLAGS,
                    "-o", str(out)], check=True)
    lib = ctypes.CDLL(str(out))
    lib.fs_paged_decode_attention.argtypes = ([ctypes.c_void_p] * 6 + [ctypes.c_int64] * 7
                                              + [ctypes.c_float])
    return lib


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("jobs", type=int)
    p.add_argument("context", type=int)
    p.add_argument("--against", help="a git revision whose kernel is timed beside this one")
    a = p.parse_args()
    torch.set_num_threads(2)
    root = pathlib.Path(__file__).resolve().parents[2]
    tmp = pathlib.Path(tempfile.mkdtemp())
    kernels = {"this tree": build((root / SOURCE).read_text(), tmp / "this.so")}
    if a.against:
        old = subprocess.run(["git", "show", f"{a.against}:{SOURCE}"], cwd=root, check=True,
                             capture_output=True, text=True).stdout
        kernels[a.against] = build(old, tmp / "against.so")
    pool = [(torch.randn(NUM_BLOCKS, BLOCK, KV_HEADS, DIM),
             torch.randn(NUM_BLOCKS, BLOCK, KV_HEADS, DIM)) for _ in range(LAYERS)]
    per_job = -(-a.context // BLOCK)
    tables = torch.randperm(NUM_BLOCKS)[: a.jobs * per_job].view(a.jobs, per_job).contiguous()
    lens = torch.full((a.jobs,), a.context, dtype=torch.int64)
    q = torch.randn(a.jobs, HEADS, DIM)
    out = torch.empty_like(q)

    def run(lib: ctypes.CDLL, layer: int) -> torch.Tensor:
        k, v = pool[layer]
        lib.fs_paged_decode_attention(q.data_ptr(), k.data_ptr(), v.data_ptr(),
                                      tables.data_ptr(), lens.data_ptr(), out.data_ptr(),
                                      a.jobs, HEADS, KV_HEADS, DIM, BLOCK, per_job, 0,
                                      DIM ** -0.5)
        return out.clone()

    first = [run(lib, 0) for lib in kernels.values()]
    print(f"max difference between the kernels {(first[0] - first[-1]).abs().max().item():.1e}")
    times: dict[str, list[float]] = {name: [] for name in kernels}
    for _ in range(6):
        for name, lib in kernels.items():
            start = time.perf_counter()
            for _ in range(5):
                for layer in range(LAYERS):
                    run(lib, layer)
            times[name].append((time.perf_counter() - start) / 5)
    read = a.jobs * a.context * KV_HEADS * DIM * 4 * 2 * LAYERS
    for name, values in times.items():
        median = sorted(values)[len(values) // 2]
        print(f"{name:>10s}: {median * 1e3:6.2f} ms for {LAYERS} layers "
              f"({read / median / 1e9:.1f} GB/s of keys and values)")


if __name__ == "__main__":
    main()
