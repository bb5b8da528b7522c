"""The worker's compute thread: one thread for every call, a clear error once closed."""

from __future__ import annotations

import threading

import pytest

from worker_svc.compute_thread import ComputeThread, ComputeThreadClosed


def test_every_call_runs_on_the_same_thread_in_order():
    compute = ComputeThread()
    seen: list[tuple[int, int]] = []
    callers = [threading.Thread(target=lambda i=i: compute.run(
        lambda: seen.append((i, threading.get_ident())))) for i in range(6)]
    for t in callers:
        t.start()
    for t in callers:
        t.join()
    assert len(seen) == 6 and len({ident for _, ident in seen}) == 1
    assert seen[0][1] != threading.get_ident()
    with pytest.raises(ZeroDivisionError):
        compute.run(lambda: 1 / 0)  # the caller gets the error; the thread lives on
    assert compute.run(lambda: threading.get_ident()) == seen[0][1]
    compute.close()
    with pytest.raises(ComputeThreadClosed):
        compute.run(lambda: None)
