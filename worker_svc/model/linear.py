"""Linear layers with weights laid out once for the fastest kernel on this machine.

Two CPU kernels compute the same float32 product:
- ``blas``: ``F.linear`` on the plain weight (MKL or OpenBLAS sgemm);
- ``onednn``: the weight reordered once into oneDNN's blocked layout and multiplied with
  ``mkldnn._linear_pointwise`` (the kernel PyTorch's own compiler emits for frozen linears).

Which is faster depends on the processor, its BLAS and the number of rows, not on the model:
measured on the model's own 30 layers with weights cold in cache, oneDNN was about 2x faster
than sgemm at every row count on an AMD EPYC (MKL takes a slow path there), while on an Intel
Xeon sgemm was 1.4x faster at one row and oneDNN 1.2x faster at 8. So ``auto`` (the default)
times both on the model's own weights when it loads (``pick_kernel``) and keeps one layout
when one kernel wins everywhere, or both (twice the weight memory) with the row count from
which oneDNN takes over. Off the CPU it is always ``F.linear``.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

KERNELS = ("auto", "blas", "onednn")
# Rows timed by `pick_kernel`: lone decodes, decode batches, prefill chunks.
TUNE_ROWS = (1, 2, 4, 8, 16, 32, 128)
TUNE_REPEATS = 3
NEVER = 1 << 62


def onednn_usable(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
    )


class Linear:
    """``y = x @ weight.T + bias`` for 2-D ``x``: ``F.linear`` below ``onednn_from_rows``
    rows, oneDNN's packed weight from there on."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 kernel: str = "blas"):
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self._weight: torch.Tensor | None = weight
        self._packed: torch.Tensor | None = None
        self.onednn_from_rows = NEVER
        self.use(kernel)

    @property
    def kernel(self) -> str:
        if self.onednn_from_rows >= NEVER:
            return "blas"
        return "onednn" if self.onednn_from_rows <= 1 else f"blas<{self.onednn_from_rows}"

    def use(self, kernel: str, onednn_from_rows: int | None = None) -> None:
        """Lay the weight out for ``kernel`` ("blas" or "onednn"; "onednn" falls back to
        "blas" where oneDNN cannot run), dropping the other layout; with
        ``onednn_from_rows``, keep both and switch to oneDNN from that many rows."""
        if kernel not in ("blas", "onednn"):
            raise ValueError(f"linear kernel must be blas or onednn, got {kernel!r}")
        if kernel == "blas" or not onednn_usable(self._weight_or_packed()):
            if self._weight is None:
                self._weight = self._packed.to_dense()
            self._packed, self.onednn_from_rows = None, NEVER
            return
        if self._packed is None:
            self._packed = self._weight.contiguous().to_mkldnn()
        if onednn_from_rows is not None and onednn_from_rows > 1:
            if self._weight is None:
                self._weight = self._packed.to_dense()
            self.onednn_from_rows = onednn_from_rows
        else:
            self._weight, self.onednn_from_rows = None, 1

    def _weight_or_packed(self) -> torch.Tensor:
        return self._weight if self._weight is not None else self._packed

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[0] == 0:
            return x.new_empty((0, self.out_features))
        if x.shape[0] < self.onednn_from_rows:
            return F.linear(x, self._weight, self.bias)
        return torch.ops.mkldnn._linear_pointwise(
            x.contiguous(), self._packed, self.bias, "none", [], ""
        )


def pick_kernel(linears: Sequence[Linear], kernel: str = "auto") -> str:
    """Set every linear to ``kernel``; for "auto", time blas and onednn on these very linears
    (each at ``TUNE_ROWS`` rows, best of ``TUNE_REPEATS``) and split the row counts where the
    summed time relative to the faster kernel at each size is least: blas below the split,
    oneDNN from it (one layout when no split beats it by 2%). Returns the
    choice as ``Linear.kernel`` names it ("blas", "onednn" or "blas<R")."""
    if kernel not in KERNELS:
        raise ValueError(f"linear kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if kernel != "auto":
        for lin in linears:
            lin.use(kernel)
        return linears[0].kernel if linears else kernel
    if not linears or not onednn_usable(linears[0]._weight_or_packed()):
        return pick_kernel(linears, "blas")
    blas, onednn = _time_all(linears, "blas"), _time_all(linears, "onednn")
    best = [min(b, o) for b, o in zip(blas, onednn)]

    def cost(split: int) -> float:  # blas for TUNE_ROWS[:split], onednn for the rest
        return (sum(b / m for b, m in zip(blas[:split], best[:split]))
                + sum(o / m for o, m in zip(onednn[split:], best[split:])))

    n = len(TUNE_ROWS)
    one_layout = min((n, 0), key=cost)  # all blas, all onednn
    start = min(range(n + 1), key=cost)
    if cost(start) > cost(one_layout) - 0.02 * n:
        start = one_layout
    log.info("linear time blas / onednn at %s rows: %s", "/".join(map(str, TUNE_ROWS)),
             ", ".join(f"{b / o:.2f}" for b, o in zip(blas, onednn)))
    if start == n:
        return pick_kernel(linears, "blas")
    for lin in linears:
        lin.use("onednn", TUNE_ROWS[start])
    return linears[0].kernel


@torch.inference_mode()
def _time_all(linears: Sequence[Linear], kernel: str) -> list[float]:
    """One pass over every linear with ``kernel``, best of ``TUNE_REPEATS``, for each of
    ``TUNE_ROWS`` rows (weights mostly cold in cache, as in serving)."""
    for lin in linears:
        lin.use(kernel)
    ref = linears[0]._weight_or_packed()
    times = []
    for rows in TUNE_ROWS:
        xs = {n: torch.randn(rows, n, dtype=ref.dtype, device=ref.device)
              for n in {lin.in_features for lin in linears}}
        for lin in linears:  # warm-up: primitives created, weights touched once
            lin(xs[lin.in_features])
        best = float("inf")
        for _ in range(TUNE_REPEATS):
            start = time.perf_counter()
            for lin in linears:
                lin(xs[lin.in_features])
            best = min(best, time.perf_counter() - start)
        times.append(best)
    return times
