"""The overload tests' simulations (test_simulator.py), run on the compiled core.

They are the suite's longest simulations: hundreds of requests at 1.5-3x FCFS's capacity at the
published scale. A process runs one core or the other, so each test's runs go to a process of
their own, which loads the compiled core (``scheduler_svc/compiled.py``; the interpreted one,
with a warning, where it cannot be built). test_compiled.py checks that the two give the same
records.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
SHARED_TRACES = HERE.parents[2] / "shared" / "traces"

SCRIPT = """
import json, sys
from scheduler_svc import compiled
compiled.activate()
sys.path.insert(0, sys.argv[1])
from overload_sims import figures
print(json.dumps(figures(**json.loads(sys.argv[2]))))
"""


def figures(trace: str, rate: float, n: int, runs: list[list[str]]
            ) -> dict[str, dict[str, float]]:
    """Each ``[policy, kv_policy]`` of ``runs`` (or ``[policy, kv_policy, {setting: value}]``,
    other scheduler settings) on the first ``n`` requests of a shared trace
    at ``rate``, at the published scale
    (OPT-13B/A100, batch 16, 4,096 blocks, a 40,000-block store; `predictive` at prediction
    sigma 0.75): its tokens/s, makespan, swap-outs, recomputes and swap wait, keyed
    ``policy+kv_policy`` (``+setting=value`` for each setting, sorted)."""
    from fastserve.traces import load_trace
    from scheduler_svc.core.config import SchedulerConfig
    from scheduler_svc.core.cost_model import OPT_13B_A100
    from scheduler_svc.sim import simulate

    reqs = load_trace(str(SHARED_TRACES / trace), rate=rate, num_requests=n, seed=0)
    out = {}
    for policy, kv, *more in runs:
        settings = more[0] if more else {}
        r = simulate(reqs, config=SchedulerConfig(policy=policy, kv_policy=kv,
                                                  max_batch_size=16, **settings),
                     cost_model=OPT_13B_A100, num_blocks=4096, store_blocks=40000,
                     prediction_sigma=0.75 if policy == "predictive" else None)
        s = r.summary()
        out["+".join([policy, kv, *(f"{k}={v}" for k, v in sorted(settings.items()))])] = {
            "tokens_s": s["throughput_tokens_s"], "makespan_s": s["makespan_s"],
            "mean_jct_s": s["mean_jct_s"],
            "swap_outs": r.num_swap_outs, "recomputes": r.num_recomputes,
            "swap_wait_s": r.swap_wait_s}
    return out


def overloaded(trace: str, rate: float, n: int, runs: list[tuple]
               ) -> dict[str, dict[str, float]]:
    """``figures`` in a process of its own, on the compiled core."""
    spec = {"trace": trace, "rate": rate, "n": n, "runs": [list(r) for r in runs]}
    p = subprocess.run([sys.executable, "-c", SCRIPT, str(HERE), json.dumps(spec)],
                       capture_output=True, text=True, timeout=900, check=False)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])
