"""The one thread that runs every piece of the worker's tensor work.

PyTorch's CPU kernels run on an OpenMP thread team that belongs to the thread that calls them.
A team whose calls stop keeps its threads spinning for a while, and a second calling thread
gets a second team: on a machine with as many cores as threads the two teams fight, and every
parallel kernel waits for a descheduled thread. Measured here (SmolLM2-135M, 2 cores, float32):
one decode took 42 ms on the thread that loaded the model and 58-62 ms on any other thread, a
single small linear 33 us against 129 us. gRPC hands each call to whichever of its pool's
threads is free, so the worker sends every model load, warm-up, profile and Step through this
one thread instead.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

T = TypeVar("T")


class ComputeThreadClosed(RuntimeError):
    """The compute thread is gone: closed, or the interpreter is exiting."""


class ComputeThread:
    """Runs callables one at a time, in order, always on the same thread."""

    def __init__(self, name: str = "compute"):
        # One worker thread, created on first use and kept for the executor's life.
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)

    def run(self, fn: Callable[..., T], *args, **kwargs) -> T:
        """``fn(*args, **kwargs)`` on the compute thread; blocks until it returns (or raises).
        Raises ``ComputeThreadClosed`` once the thread is closed (also at interpreter exit,
        when concurrent.futures shuts its executors down)."""
        try:
            future = self._executor.submit(fn, *args, **kwargs)
        except RuntimeError as e:
            raise ComputeThreadClosed(str(e)) from None
        return future.result()

    def close(self) -> None:
        self._executor.shutdown(wait=True)
