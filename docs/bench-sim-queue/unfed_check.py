"""How often a Step ends with tokens and batch slots left although, during its walk,
prefills sure of their blocks covered the token budget (so new jobs walked after them were
passed as unfed), with jobs waiting: an upper bound on the Steps where a passed job could
have had tokens; and in those Steps, how many of the prefills sure of their blocks when the
budget was first covered are in the plan (or were dropped by the trim, or were left out when
chunks were sized), the uploads, commands and free blocks after. Interpreted (it wraps
``Batcher``); arguments as for ``fastserve sim``:

    FASTSERVE_COMPILED=0 python docs/bench-sim-queue/unfed_check.py sim --trace T.csv ...
"""

from __future__ import annotations

import atexit
import pathlib
import runpy
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))


def watch_cover(cls: type) -> list[list[int]]:
    """Wrap ``cls._covers`` (the batcher's): the list returned holds, once a Step's walk first
    finds its budget covered, the ids of the prefills sure of their blocks then (the caller
    clears it before each Step)."""
    covers = cls._covers
    sure_at_cover: list[list[int]] = []

    def watched_covers(self, prefills, budget):
        covered = covers(self, prefills, budget)
        if covered and not sure_at_cover:
            sure_at_cover.append([j.job_id for j in prefills if j.job_id in self._sure])
        return covered

    cls._covers = watched_covers
    return sure_at_cover


def tokens_left(batcher, step, num_waiting: int) -> int:
    """The tokens a formed Step left unused, where it also left batch slots while jobs
    waited (0 otherwise)."""
    plan = step.plan
    left = batcher.config.max_batched_tokens - plan.num_batched_tokens
    slots = (step.max_batch or batcher.config.max_batch_size) - len(plan.commands)
    return left if left > 0 and slots > 0 and num_waiting > 0 else 0


def main() -> None:
    from scheduler_svc.core import batcher

    stats = {"steps": 0, "covered": 0, "left": 0, "left_tokens": 0, "sure_in_plan": 0,
             "sure_trimmed_not_in_plan": 0, "sure_sized_not_in_plan": 0, "uploads": 0,
             "commands": 0, "free_blocks_after": 0}
    form = batcher.Batcher.form
    sure_at_cover = watch_cover(batcher.Batcher)

    def watched_form(self, step, num_live, num_waiting, num_waiting_single=0):
        sure_at_cover.clear()
        form(self, step, num_live, num_waiting, num_waiting_single)
        stats["steps"] += 1
        if sure_at_cover:
            stats["covered"] += 1
            plan = step.plan
            left = tokens_left(self, step, num_waiting)
            if left:
                stats["left"] += 1
                stats["left_tokens"] += left
                in_plan = {c.job_id for c in plan.commands}
                trimmed = {j.job_id for j in self._trimmed}
                for jid in sure_at_cover[0]:
                    stats["sure_in_plan" if jid in in_plan
                          else "sure_trimmed_not_in_plan" if jid in trimmed
                          else "sure_sized_not_in_plan"] += 1
                stats["uploads"] += len(plan.swap_in)
                stats["commands"] += len(plan.commands)
                stats["free_blocks_after"] += self.ledger.num_free

    batcher.Batcher.form = watched_form
    atexit.register(lambda: print("unfed check", stats, file=sys.stderr))
    sys.argv = ["fastserve", *sys.argv[1:]]
    runpy.run_module("fastserve.cli", run_name="__main__")


if __name__ == "__main__":
    main()
