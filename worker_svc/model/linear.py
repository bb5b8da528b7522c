"""Linear layers with weights laid out once for the fastest kernel on this machine.

Three CPU kernels compute the same float32 product, each on its own layout of the weight:
- ``blas``: ``F.linear`` on the plain weight (MKL or OpenBLAS sgemm);
- ``onednn``: the weight reordered into oneDNN's blocked layout, ``mkldnn._linear_pointwise``
  (the kernel PyTorch's own compiler emits for frozen linears);
- ``tiled``: the weight packed in column tiles and streamed once by the native decode-sized
  kernel (csrc/small_gemm.c), 8 rows of input per weight load.

Which is fastest depends on the processor, its BLAS and the number of rows, not on the model.
Measured on the model's own 30 layers with weights cold in cache: on an AMD EPYC oneDNN was
about 2x faster than sgemm at every row count (MKL takes a slow path there); on an Intel Xeon
sgemm was fastest at 1-2 rows, the tiled kernel at 4-8 (25 ms against oneDNN's 32 ms and
sgemm's 34 ms at 8 rows), and oneDNN and sgemm tied from 32 rows. So ``auto`` (the default)
times every kernel on the model's own weights when it first loads on a machine
(``pick_kernel``; the plan is cached by shapes, dtype, processor and torch version, and timed
again at the next start if other processes took the cores meanwhile) and gives
each band of row counts its fastest kernel, keeping at most two layouts (so at most twice the
weight memory). Off the CPU it is always ``F.linear``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pathlib
import time
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from fastserve.cpu_load import OtherWork
from worker_svc.model import native

log = logging.getLogger(__name__)

KERNELS = ("auto", "blas", "onednn", "tiled")
# Row counts timed by `pick_kernel`; a count between two of them takes the larger one's kernel.
TUNE_ROWS = (1, 2, 4, 8, 16, 32, 128)
TUNE_REPEATS = 3
# A plan with a second layout must beat the best single layout by this share, per row count.
SECOND_LAYOUT_GAIN = 0.02
# A plan timed while other processes took more than this share of this process's cores (in
# any kernel's turn) is timed again at the next start: a burst of other work in one kernel's
# turn makes it lose (fastserve/cpu_load.py), and a cached plan is kept for good. After this
# many such timings in a row (ranks of a group that always load together), the last is kept.
CONTENDED_SHARE = 0.2
CONTENDED_TIMINGS = 3
# In every plan's cache key: 2 since plans timed beside other work are timed again (one such
# plan, with no tiled kernel, had kept the default model's decodes 2-2.5x slower), so that
# plans cached before are timed again.
PLAN_VERSION = 2


def onednn_usable(weight: torch.Tensor) -> bool:
    return (
        weight.device.type == "cpu"
        and weight.dtype in (torch.float32, torch.bfloat16)
        and torch.backends.mkldnn.is_available()
    )


def usable_kernels(weight: torch.Tensor) -> list[str]:
    """The kernels that can run ``weight`` here, ``blas`` first."""
    out = ["blas"]
    if onednn_usable(weight):
        out.append("onednn")
    if weight.device.type == "cpu" and weight.dtype == torch.float32 and native.library():
        out.append("tiled")
    return out


class Linear:
    """``y = x @ weight.T + bias`` for 2-D ``x``; the kernel is chosen by the row count."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None,
                 kernel: str = "blas"):
        self.out_features, self.in_features = weight.shape
        self.bias = bias
        self.dtype, self.device = weight.dtype, weight.device
        self._layouts: dict[str, torch.Tensor] = {"blas": weight}
        # (largest row count, kernel) bands in increasing order; the last covers the rest.
        self._plan: list[tuple[int, str]] = [(1 << 62, "blas")]
        self.use(kernel)

    @property
    def kernel(self) -> str:
        """The plan, e.g. "blas", or "blas<=2,tiled<=8,onednn" for bands of row counts."""
        parts = [f"{k}<={r}" for r, k in self._plan[:-1]] + [self._plan[-1][1]]
        return ",".join(parts)

    def use(self, kernel: str) -> None:
        """Run every row count on ``kernel`` (falling back to blas where it cannot run)."""
        self.use_plan([(1 << 62, kernel)])

    def use_plan(self, plan: Sequence[tuple[int, str]]) -> None:
        """Bands of (largest row count, kernel); keeps exactly the layouts the plan uses."""
        weight = self._weight()
        usable = usable_kernels(weight)
        for _, k in plan:
            if k not in KERNELS[1:]:
                raise ValueError(f"linear kernel must be one of {', '.join(KERNELS[1:])}, "
                                 f"got {k!r}")
        merged: list[tuple[int, str]] = []
        for rows, k in plan:
            k = k if k in usable else "blas"
            if merged and merged[-1][1] == k:
                merged[-1] = (rows, k)
            else:
                merged.append((rows, k))
        merged[-1] = (1 << 62, merged[-1][1])
        needed = {k for _, k in merged}
        if "tiled" in needed:  # the tiled layout cannot give the plain weight back
            needed.add("blas")
        for k in needed - set(self._layouts):
            self._layouts[k] = _lay_out(weight, k)
        for k in set(self._layouts) - needed:
            del self._layouts[k]
        self._plan = merged

    def _weight(self) -> torch.Tensor:
        """The plain weight, from whichever layout is kept."""
        if "blas" in self._layouts:
            return self._layouts["blas"]
        if "onednn" in self._layouts:
            return self._layouts["onednn"].to_dense()
        raise RuntimeError("no plain weight kept")  # use_plan keeps blas beside tiled

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.shape[0]
        if rows == 0:
            return x.new_empty((0, self.out_features))
        kernel = next(k for r, k in self._plan if rows <= r)
        w = self._layouts[kernel]
        if kernel == "blas":
            return F.linear(x, w, self.bias)
        if kernel == "tiled":
            return native.small_gemm(x, w, self.out_features, self.bias)
        return torch.ops.mkldnn._linear_pointwise(x.contiguous(), w, self.bias, "none", [], "")


def _lay_out(weight: torch.Tensor, kernel: str) -> torch.Tensor:
    if kernel == "onednn":
        return weight.contiguous().to_mkldnn()
    if kernel == "tiled":
        return native.small_gemm_pack(weight)
    return weight


def pick_kernel(linears: Sequence[Linear], kernel: str = "auto") -> str:
    """Set every linear to ``kernel``; for "auto", time each usable kernel on these very
    linears at ``TUNE_ROWS`` rows (best of ``TUNE_REPEATS``) and give every band of row counts
    its fastest kernel among the best set of at most two layouts (the tiled layout is always
    kept beside the plain one, which it cannot give back). Returns ``Linear.kernel``'s name of
    the plan."""
    if kernel not in KERNELS:
        raise ValueError(f"linear kernel must be one of {', '.join(KERNELS)}, got {kernel!r}")
    if not linears:
        return kernel
    if kernel != "auto":
        for lin in linears:
            lin.use(kernel)
        return linears[0].kernel
    candidates = usable_kernels(linears[0]._weight())
    if len(candidates) == 1:
        return pick_kernel(linears, "blas")
    cache = _plan_path(linears, candidates)
    plan, contended = _load_plan(cache)
    if plan is None or contended:
        plan, busy = _time_plan(linears, candidates)
        if busy is not None and busy > CONTENDED_SHARE:
            contended += 1
            log.warning("linear kernels timed while other processes took %.0f%% of this "
                        "process's cores (%d such timing(s) in a row): plan %s %s", 100 * busy,
                        contended, plan, "kept from now on" if contended >= CONTENDED_TIMINGS
                        else "used now and timed again at the next start")
        else:
            contended = 0
        _save_plan(cache, plan, contended if contended < CONTENDED_TIMINGS else 0)
    for lin in linears:
        lin.use_plan(plan)
    return linears[0].kernel


def _time_plan(linears: Sequence[Linear],
               candidates: Sequence[str]) -> tuple[list[tuple[int, str]], float | None]:
    """The plan, and the largest share of the cores other processes took while one kernel
    was timed (None: not measurable here). Kernels are timed one after another, so a burst of
    other work during one kernel's turn alone would make it lose: a turn that other work
    took more than ``CONTENDED_SHARE`` of is timed once more (a process starting beside this
    one, as a worker's scheduler does, is busy for a few seconds), until one turn is
    contended twice: that is steady contention (the other ranks of a group loading beside
    this one), which slows every kernel, and the turns after it are not timed twice."""
    times: dict[str, list[float]] = {}
    busiest: float | None = None
    steady = False
    for k in candidates:
        for _ in range(1 if steady else 2):
            watch = OtherWork()
            times[k] = _time_all(linears, k)
            share = watch.share()
            if share is None or share <= CONTENDED_SHARE:
                break
        else:
            steady = True
        if share is not None:
            busiest = share if busiest is None else max(busiest, share)
    for lin in linears:
        lin.use("blas")
    best = [min(times[k][i] for k in candidates) for i in range(len(TUNE_ROWS))]

    def cost(kernels: Sequence[str]) -> float:
        return sum(min(times[k][i] for k in kernels) / best[i] for i in range(len(TUNE_ROWS)))

    singles = [(k,) for k in candidates if k != "tiled"]
    pairs = [("blas", k) for k in candidates if k != "blas"]
    one, chosen = min(singles, key=cost), min(pairs, key=cost)
    if cost(chosen) > cost(one) - SECOND_LAYOUT_GAIN * len(TUNE_ROWS):
        chosen = one
    plan = [(rows, min(chosen, key=lambda k: times[k][i])) for i, rows in enumerate(TUNE_ROWS)]
    log.info("linear time (ms) per kernel at %s rows: %s", "/".join(map(str, TUNE_ROWS)),
             "; ".join(f"{k} " + "/".join(f"{t * 1e3:.1f}" for t in times[k]) for k in times))
    return plan, busiest


def _plan_path(linears: Sequence[Linear], candidates: Sequence[str]) -> pathlib.Path:
    """Where the plan for these shapes on this machine and these native kernels is kept
    (timing takes seconds)."""
    from fastserve.models import cache_dir

    ident = json.dumps([[lin.out_features, lin.in_features] for lin in linears]
                       + [PLAN_VERSION, str(linears[0].dtype), torch.__version__,
                          list(candidates), native.cpu_id(), TUNE_ROWS,
                          native.build_key() if "tiled" in candidates else ""])
    key = hashlib.sha256(ident.encode()).hexdigest()[:16]
    return cache_dir() / "kernels" / f"linear-plan-{key}.json"


def _load_plan(path: pathlib.Path) -> tuple[list[tuple[int, str]] | None, int]:
    """The cached plan (None: none usable) and how many timings in a row beside other work
    gave it (0: kept for good)."""
    try:
        saved = json.loads(path.read_text())
        plan = [(int(r), str(k)) for r, k in saved["plan"]]
        contended = int(saved["contended"])
    except (OSError, ValueError, TypeError, KeyError):
        return None, 0
    if not plan or not all(k in KERNELS[1:] for _, k in plan):
        return None, 0
    return plan, max(contended, 0)


def _save_plan(path: pathlib.Path, plan: list[tuple[int, str]], contended: int) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps({"plan": plan, "contended": contended}))
        os.replace(tmp, path)
    except OSError as e:
        log.warning("cannot cache the linear plan at %s: %s", path, e)


@torch.inference_mode()
def _time_all(linears: Sequence[Linear], kernel: str) -> list[float]:
    """One pass over every linear with ``kernel``, best of ``TUNE_REPEATS``, for each of
    ``TUNE_ROWS`` rows (weights mostly cold in cache, as in serving)."""
    for lin in linears:
        lin.use(kernel)
    ref = linears[0]
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
