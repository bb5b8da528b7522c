"""The default model's linear plan timed on a quiet machine and beside busy processes.

Loads the model on sgemm, then times the three kernels over its own 30 layers as a worker's
first load does (``linear._time_plan``): quiet, with a child process spinning on one of this
process's cores all along, and with two spinning only while the tiled kernel is timed (a
burst in one kernel's turn), twice each in turn; prints each plan and the share of the cores
other processes took meanwhile, over the whole timing and at most in one kernel's turn
(``fastserve.cpu_load``):

    python docs/bench-linear-plan/contended.py
"""

from __future__ import annotations

import logging
import pathlib
import subprocess
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

SPIN = "import time\nend = time.monotonic() + 600\nwhile time.monotonic() < end: pass"


def main() -> int:
    from fastserve.cpu_load import OtherWork
    from worker_svc.loader import EngineConfig, load_engine
    from worker_svc.model import linear

    logging.basicConfig(level=logging.INFO, format="  %(message)s")
    model = load_engine(EngineConfig("SmolLM2-135M-Instruct", num_blocks=64, predictor="none",
                                     max_context=600, linear_kernel="blas")).engine.model
    lins = [v for layer in model.layers for v in layer.values()
            if isinstance(v, linear.Linear)]
    candidates = linear.usable_kernels(lins[0]._weight())
    time_all = linear._time_all
    burst: list[str] = []

    def timed(linears, kernel):  # two busy processes during the kernels in ``burst``
        spin = [subprocess.Popen([sys.executable, "-c", SPIN])
                for _ in range(2 if kernel in burst else 0)]
        try:
            return time_all(linears, kernel)
        finally:
            for child in spin:
                child.kill()
                child.wait()

    linear._time_all = timed
    labels = ("quiet", "beside a busy process", "two busy processes in the tiled kernel's turn")
    for label in labels * 2:
        burst[:] = ["tiled"] if "turn" in label else []
        child = subprocess.Popen([sys.executable, "-c", SPIN]) if "beside" in label else None
        try:
            watch = OtherWork()
            plan, busiest = linear._time_plan(lins, candidates)
            share = watch.share()
        finally:
            if child is not None:
                child.kill()
                child.wait()
        bands = ",".join(f"{k}<={r}" for r, k in plan)
        print(f"{label}: others took {100 * (share or 0):.0f}% of the cores (at most "
              f"{100 * (busiest or 0):.0f}% in one kernel's turn); plan {bands}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
