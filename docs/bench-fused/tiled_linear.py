"""The tiled decode linear against sgemm: 30 weights of 3072 x 576 (cold in cache) at 1, 4
and 8 rows, in ms per pass and GB/s of weight read.

    python docs/bench-fused/tiled_linear.py
"""

from __future__ import annotations

import time

import torch
import torch.nn.functional as F

from worker_svc.model import native

N, K, LAYERS = 3072, 576, 30


def main() -> None:
    torch.set_num_threads(2)
    weights = [torch.randn(N, K) for _ in range(LAYERS)]
    packed = [native.small_gemm_pack(w) for w in weights]
    gb = sum(w.numel() for w in weights) * 4 / 1e9
    for rows in (1, 4, 8):
        x = torch.randn(rows, K)
        runs = {
            "tiled": lambda x=x: [native.small_gemm(x, p, N, None) for p in packed],
            "sgemm": lambda x=x: [F.linear(x, w) for w in weights],
        }
        for name, run in runs.items():
            for _ in range(2):
                run()
            start, reps = time.perf_counter(), 10
            for _ in range(reps):
                run()
            dt = (time.perf_counter() - start) / reps
            print(f"{rows} rows {name}: {dt * 1e3:.2f} ms, {gb / dt:.1f} GB/s")


if __name__ == "__main__":
    main()
