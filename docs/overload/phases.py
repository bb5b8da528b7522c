"""Throughput before and after the last arrival of an overloaded simulation: whether a
policy loses tokens/s while requests arrive (churn) or only in the drain, where the jobs it put
off run last (docs/benchmarks.md, "Overload on traces the matrix had not seen").

    python docs/overload/phases.py POLICY KV_POLICY NUM_REQUESTS RATE TRACE

OPT-13B/A100 cost model, batch 16, 4,096 blocks, a 40,000-block store, `predictive` at
prediction sigma 0.75; every iteration planned (no fast-forward), so each is counted.
Instruments GroupCore.schedule from outside; changes nothing.
"""

from __future__ import annotations

from published import run

from scheduler_svc.core.cost_model import OPT_13B_A100


def main() -> None:
    iterations: list[tuple[float, int, float, int]] = []  # (start, decodes, compute s, prefill)

    def each(core, now, plan, last):
        if plan is not None and plan.commands:
            decodes = sum(1 for c in plan.commands if c.num_tokens == 1)
            prefill = sum(c.num_tokens for c in plan.commands if c.num_tokens > 1)
            iterations.append((now, decodes, OPT_13B_A100.iteration_time(decodes, prefill),
                               prefill))

    r = run(each)
    s, last = r.summary, r.last_arrival_s
    print(f"{r.policy} + {r.kv}: {s['throughput_tokens_s']:.1f} tok/s over "
          f"{s['makespan_s']:.0f} s, last arrival at {last:.0f} s")
    for name, drain in (("while arriving", False), ("drain", True)):
        part = [it for it in iterations if (it[0] > last) == drain]
        decodes, compute = sum(it[1] for it in part), sum(it[2] for it in part)
        each = max(len(part), 1)
        print(f"  {name:15s} {len(part):6d} iterations, {decodes / each:5.2f} decodes and "
              f"{sum(it[3] for it in part) / each:5.1f} prompt tokens each, "
              f"{decodes / max(compute, 1e-9):6.1f} decoded tok/s of compute, "
              f"{compute:6.0f} s of compute")


if __name__ == "__main__":
    main()
