"""The drain of an overloaded simulation, against what bounds it: the jobs left at the last
arrival, the iterations after it, and how the device's blocks were used in them
(docs/benchmarks.md, "A store too full to take a paused job").

    python docs/overload/drain.py POLICY KV_POLICY NUM_REQUESTS RATE TRACE

Bounds on the drain's iterations, from the jobs live at the last arrival: "slots", their
remaining output tokens over the batch size; "memory", the blocks their remaining decodes
hold (each decode holds its whole context) over the device's blocks; "longest", the most
output tokens any one has left. No order can drain them in fewer iterations than the largest.
Also how often the blocks a plan left free (less the start reserve) were too few to start the
smallest job waiting with no KV: free blocks no waiting job could use.
Settings of docs/overload/published.py (OPT-13B/A100, batch 16, 4,096 blocks, a 40,000-block
store, `predictive` at sigma 0.75, every iteration planned). Instruments GroupCore.schedule
from outside; changes nothing.
"""

from __future__ import annotations

from published import BATCH, BLOCKS, run

from scheduler_svc.core.batcher import _whole
from scheduler_svc.core.kv.allocator import blocks_for


def main() -> None:
    left: dict[str, int] = {}
    sums = dict.fromkeys(("iterations", "full", "decodes", "decoding", "prefilling", "paused",
                          "free", "waiting", "too_few"), 0)

    def each(core, now, plan, last):
        if now <= last:
            return
        if not left:  # the jobs live at the last arrival
            bs = core.kv.block_size
            live = [j for j in core.jobs.values() if not j.status.finished]
            todo = [(j.max_tokens - len(j.output), j.num_tokens) for j in live]
            left.update(live=len(live), tokens=sum(r for r, _ in todo),
                        blocks=sum(blocks_for(c + k + 1, bs) for r, c in todo for k in range(r)),
                        longest=max(r for r, _ in todo))
        if plan is not None and plan.commands:
            tokens = {c.job_id: c.num_tokens for c in plan.commands}
            sums["iterations"] += 1
            sums["full"] += len(tokens) >= BATCH
            sums["decodes"] += sum(1 for t in tokens.values() if t == 1)
            for job_id, job in core.kv.holding.items():
                t = tokens.get(job_id, 0)
                kind = "decoding" if t == 1 else "prefilling" if t > 1 else "paused"
                sums[kind] += len(job.kv.blocks)
            sums["free"] += core.kv.num_free
            # Jobs with no KV anywhere wait to start on blocks for their whole context: were
            # the blocks left free after this plan too few for the smallest of them?
            bs = core.kv.block_size
            needs = [blocks_for(j.num_tokens + 1, bs) for j in core.jobs.values()
                     if not j.status.finished and _whole(j)]
            if needs:
                sums["waiting"] += 1
                sums["too_few"] += core.kv.num_free - core.batcher.start_reserve < min(needs)

    r = run(each)
    s = r.summary
    it = max(sums["iterations"], 1)
    print(f"{r.policy} + {r.kv} at {r.rate} req/s: {s['throughput_tokens_s']:.1f} tok/s; at the "
          f"last arrival {left['live']} jobs live, {left['tokens']} tokens to decode, "
          f"{left['blocks'] / max(left['tokens'], 1):.0f} blocks held per decode")
    print(f"  drain {sums['iterations']} iterations, {sums['decodes'] / it:.2f} decodes each, "
          f"{sums['full'] / it:.0%} with every slot taken; bounds: slots "
          f"{left['tokens'] / BATCH:.0f}, memory {left['blocks'] / BLOCKS:.0f}, longest "
          f"{left['longest']}")
    print("  blocks per iteration: " + ", ".join(
        f"{k} {sums[k] / it:.0f}" for k in ("decoding", "prefilling", "paused", "free")))
    print(f"  a job waited to start in {sums['waiting']} iterations; in "
          f"{sums['too_few'] / max(sums['waiting'], 1):.0%} of them the free blocks were too "
          f"few for the smallest one")


if __name__ == "__main__":
    main()
