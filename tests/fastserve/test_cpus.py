"""Cores for a node's processes (`fastserve/cpus.py`): the cpulist format, the plan
`fastserve serve --reserve-cpus` makes, and binding a real process."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from fastserve.cpus import CpuPlan, format_cpu_list, parse_cpu_list, plan_cpus


@pytest.mark.parametrize(("text", "cpus"), [("0", (0,)), ("0-3,6", (0, 1, 2, 3, 6)),
                                            ("5,1-2,2", (1, 2, 5)), (" 3 - 4 ", (3, 4))])
def test_a_cpu_list_is_read_as_linux_writes_it(text, cpus):
    assert parse_cpu_list(text) == cpus


@pytest.mark.parametrize("text", ["", "a", "1-", "3-1", "-1", "0,,1", "1.5"])
def test_a_bad_cpu_list_names_the_field(text):
    with pytest.raises(ValueError, match=r"^--cpus: "):
        parse_cpu_list(text)


def test_a_cpu_list_is_written_with_ranges():
    assert format_cpu_list([5, 0, 1, 2, 7, 8]) == "0-2,5,7-8"
    assert format_cpu_list((4,)) == "4"
    assert parse_cpu_list(format_cpu_list([9, 1, 2, 3, 11])) == (1, 2, 3, 9, 11)


def test_the_plan_keeps_the_first_cores_and_splits_the_rest_evenly():
    assert plan_cpus((0, 1), 1, 1) == CpuPlan((0,), ((1,),))
    assert plan_cpus(tuple(range(8)), 1, 3) == CpuPlan((0,), ((1, 2, 3), (4, 5), (6, 7)))
    # A cpuset with holes: the allowed cores in order, not a range.
    assert plan_cpus((2, 3, 8, 9, 10), 2, 2) == CpuPlan((2, 3), ((8, 9), (10,)))


def test_a_plan_that_leaves_a_worker_no_core_names_the_setting_and_the_limit():
    with pytest.raises(ValueError, match=r"--reserve-cpus 1: .* 2 core\(s\) \(0-1\), which "
                                         r"leaves 1 for 2 worker process\(es\).* at most 0"):
        plan_cpus((0, 1), 1, 2)
    with pytest.raises(ValueError, match=r"--reserve-cpus 4: .*at most 3"):
        plan_cpus((0, 1, 2, 3), 4, 1)


BIND = """
import os, sys, threading
from fastserve.cpus import bind_process
go, seen = threading.Event(), {}

def look(name):
    seen[name] = sorted(os.sched_getaffinity(0))

def early():  # a thread that exists before the binding, and looks after it
    go.wait()
    look("early")

th = threading.Thread(target=early)
th.start()
try:
    bind_process(tuple(int(c) for c in sys.argv[1].split(",")))
except ValueError as e:
    print("refused", e, sorted(os.sched_getaffinity(0)))
    sys.exit(0)
finally:
    go.set()
    th.join()
late = threading.Thread(target=look, args=("late",))
late.start()
late.join()
print("bound", sorted(os.sched_getaffinity(0)), seen["early"], seen["late"])
"""


def _bind(cpus: str) -> str:
    out = subprocess.run([sys.executable, "-c", BIND, cpus], capture_output=True, text=True,
                         timeout=60, check=True)
    return out.stdout.strip()


def test_binding_covers_the_threads_already_running_and_those_started_later():
    last = max(os.sched_getaffinity(0))
    assert _bind(str(last)) == f"bound [{last}] [{last}] [{last}]"


def test_binding_to_a_core_this_machine_lacks_is_refused_and_changes_nothing():
    mine = sorted(os.sched_getaffinity(0))
    out = _bind(f"{mine[0]},4095")
    assert out.startswith("refused --cpus: core(s) 4095 not available here")
    assert out.endswith(str(mine))
