"""The scheduler core compiled with mypyc (``scheduler_svc/compiled.py``) gives the figures of
the interpreted one, record for record, and ``fastserve sim`` runs it. Each run is a process
of its own: a process runs one or the other."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(shutil.which(os.environ.get("CC", "cc")) is None,
                                reason="no C compiler to build the compiled core")

TESTS = pathlib.Path(__file__).resolve().parent
# Every policy with every KV policy on an overloaded trace with bursts, one-token prompts and
# a store (test_steady's), the core's block check after every iteration.
SCRIPT = """
import hashlib, sys
sys.path.insert(0, sys.argv[2])
from scheduler_svc import compiled
if sys.argv[1] == "compiled":
    assert compiled.activate(), "the compiled core did not load"
import scheduler_svc.core.batcher as batcher
print("core", batcher.__file__)
from test_steady import overload, sim
from scheduler_svc.core.kv.policies import KV_POLICY_CLASSES
from scheduler_svc.core.policies import POLICIES
reqs = overload(160, rate=12.0)
for policy in sorted(POLICIES):
    for kv in sorted(KV_POLICY_CLASSES):
        r = sim(reqs, policy, kv, fast=True)
        text = repr((r.records, r.summary(), r.num_iterations, r.num_preemptions,
                     r.num_recomputes, r.num_swap_outs, r.num_swap_ins))
        print(policy, kv, len(r.records), hashlib.sha256(text.encode()).hexdigest()[:16])
"""


def _run(args: list[str], **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def test_the_compiled_core_gives_the_interpreted_ones_records():
    compiled = _run([sys.executable, "-c", SCRIPT, "compiled", str(TESTS)])
    assert compiled.returncode == 0, compiled.stderr[-3000:]
    interpreted = _run([sys.executable, "-c", SCRIPT, "interpreted", str(TESTS)])
    assert interpreted.returncode == 0, interpreted.stderr[-3000:]
    core_c, *runs_c = compiled.stdout.splitlines()
    core_i, *runs_i = interpreted.stdout.splitlines()
    assert core_c.endswith(".so") and core_i.endswith(".py"), (core_c, core_i)
    assert len(runs_c) == len(runs_i) >= 7 * 4
    assert all(line.split()[2] == "160" for line in runs_c), runs_c
    assert runs_c == runs_i


def test_fastserve_sim_runs_compiled_unless_told_not_to(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_text("".join(json.dumps({"arrival_s": i * 0.05, "input_tokens": 40 + i % 200,
                                         "output_tokens": 5 + (i * 37) % 300}) + "\n"
                             for i in range(400)))
    figures = []
    for env, core in (({}, "core compiled (mypyc)"),
                      ({"FASTSERVE_COMPILED": "0"}, "core interpreted")):
        out = tmp_path / f"{len(figures)}.json"
        done = _run([sys.executable, "-m", "fastserve.cli", "sim", "--trace", str(trace),
                     "--policies", "fcfs,skip-join-mlfq,predictive", "--kv-policies",
                     "proactive", "--store-blocks", "2000", "--num-blocks", "300",
                     "--json", str(out)], **env)
        assert done.returncode == 0, done.stderr[-3000:]
        assert core in done.stdout, done.stdout
        figures.append(json.loads(out.read_text()))
    assert figures[0] == figures[1]
    assert len(figures[0]) == 3
