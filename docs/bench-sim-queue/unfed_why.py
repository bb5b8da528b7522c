"""Why the prefills that covered the token budget in a Step's walk are missing from its plan,
in the Steps that end with tokens and slots left while jobs wait (the corner that
``unfed_check.py`` counts). For each such prefill, from the last time the batcher asked
whether it fits (``Batcher._fit``): whether the trim dropped it, whether it still lacked
blocks for its prompt and the start reserve, or only for the blocks promised to other new
jobs, and whether blocks were reserved for another job in that Step. Prints the counts, then
a few examples with the free blocks at the walk's check and at the last one. Interpreted (it
wraps ``Batcher``); arguments as for ``fastserve sim``:

    FASTSERVE_COMPILED=0 python docs/bench-sim-queue/unfed_why.py sim --trace T.csv ...
"""

from __future__ import annotations

import atexit
import collections
import pathlib
import runpy
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))

from unfed_check import tokens_left, watch_cover


def main() -> None:
    from scheduler_svc.core import batcher
    from scheduler_svc.core.kv.allocator import blocks_for

    cls = batcher.Batcher
    form, fit, trim = cls.form, cls._fit, cls._trim
    cover = watch_cover(cls)  # the sure prefills when the budget was first covered
    fits: dict[int, list[dict]] = collections.defaultdict(list)
    trimmed: set[int] = set()
    reasons: collections.Counter[tuple] = collections.Counter()
    examples: list[str] = []

    def watched_fit(self, job, n, *args, **kwargs):
        got = fit(self, job, n, *args, **kwargs)
        ledger = self.ledger
        fits[job.job_id].append({
            "got": got, "free_for": ledger.free_for(job),
            "reserved_for_others": ledger.num_free > ledger.free_for(job),
            "prompt": blocks_for(job.num_tokens + 1, ledger.block_size),
            "reserve": self.start_reserve if ledger.holding else 0,
            "others_promised": self._promised - self._promises.get(job.job_id, 0)})
        return got

    def watched_trim(self, prefills, budget):
        before = [j.job_id for j in prefills]
        dropped = trim(self, prefills, budget)
        trimmed.update(set(before) - {j.job_id for j in prefills})
        return dropped

    def watched_form(self, step, num_live, num_waiting, num_waiting_single=0):
        cover.clear()
        fits.clear()
        trimmed.clear()
        form(self, step, num_live, num_waiting, num_waiting_single)
        plan = step.plan
        if not cover or not tokens_left(self, step, num_waiting):
            return
        in_plan = {c.job_id for c in plan.commands}
        for jid in cover[0]:
            if jid in in_plan:
                continue
            asked = fits[jid]
            if not asked:
                reasons[("never asked again",)] += 1
                continue
            last = asked[-1]
            if last["got"]:
                why = "fitted at the last check"
            elif last["prompt"] > last["free_for"]:
                why = "prompt blocks taken"
            elif last["prompt"] + last["others_promised"] > last["free_for"]:
                why = "promised to other new jobs"
            else:
                why = "start reserve taken"
            key = ("trimmed" if jid in trimmed else "not trimmed", why,
                   "blocks reserved for others" if last["reserved_for_others"] else "")
            reasons[key] += 1
            if len(examples) < 8:
                examples.append(f"{key}: free at the walk's check {asked[0]['free_for']}, at the "
                                f"last {last['free_for']}; prompt {last['prompt']}, reserve "
                                f"{last['reserve']}, promised to others "
                                f"{last['others_promised']}; {len(plan.swap_in)} uploads")

    cls.form, cls._fit, cls._trim = watched_form, watched_fit, watched_trim

    def report() -> None:
        print("covering prefills missing from the plan, by cause:", file=sys.stderr)
        for key, n in reasons.most_common():
            print(f"  {n:5d}  {' / '.join(k for k in key if k)}", file=sys.stderr)
        for line in examples:
            print("  e.g.", line, file=sys.stderr)

    atexit.register(report)
    sys.argv = ["fastserve", *sys.argv[1:]]
    runpy.run_module("fastserve.cli", run_name="__main__")


if __name__ == "__main__":
    main()
