"""Other processes' share of this process's cores, from /proc/stat."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from fastserve.cpu_load import OtherWork, busy_seconds, cpu_times

STAT = """cpu  900 0 900 9000 90 0 0 90 0 0
cpu0 100 10 200 5000 40 5 5 30 70 0
cpu1 300 0 100 4000 50 0 0 60 0 0
cpu2 7 7 7 7 7 7 7 7 0 0
intr 12345
"""


def test_busy_time_sums_the_cores_asked_for_with_steal_and_without_idle(tmp_path):
    stat = tmp_path / "stat"
    stat.write_text(STAT)
    hz = os.sysconf("SC_CLK_TCK")
    # cpu0: user 100 + nice 10 + system 200 + irq 5 + softirq 5 + steal 30 (guest 70 is in
    # user already); cpu1: 300 + 100 + 60
    assert busy_seconds({0}, stat) == pytest.approx(350 / hz)
    assert busy_seconds({0, 1}, stat) == pytest.approx(810 / hz)
    assert busy_seconds({5}, stat) is None  # no such core
    assert busy_seconds({0}, tmp_path / "missing") is None
    # and steal alone, the hypervisor's share of the same busy time
    assert cpu_times({0}, stat) == pytest.approx((350 / hz, 30 / hz))
    assert cpu_times({0, 1}, stat) == pytest.approx((810 / hz, 90 / hz))
    assert cpu_times({5}, stat) is None


def _burn(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


@pytest.mark.skipif(busy_seconds({0}) is None, reason="needs Linux's /proc/stat")
def test_another_process_on_the_cores_counts_and_this_one_does_not():
    own = OtherWork()
    _burn(1.0)  # this process's own work
    alone = own.share()
    other = OtherWork()
    busy = "import time\nend = time.monotonic() + 1.5\nwhile time.monotonic() < end: pass"
    child = subprocess.Popen([sys.executable, "-c", busy])
    child.wait(timeout=30)
    beside = other.share()
    assert alone is not None and beside is not None
    # The child keeps one of this process's n cores busy: 1/n of their time more than the
    # machine's background (n = 2 in CI). Counting this process's own work would put the
    # same 1/n into ``alone`` and leave no difference.
    assert beside - alone > 0.5 / len(other.cpus)
