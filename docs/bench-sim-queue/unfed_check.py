"""How often a Step ends with tokens and batch slots left although, during its walk,
prefills sure of their blocks covered the token budget (so new jobs walked after them were
passed as unfed), with jobs waiting: an upper bound on the Steps where a passed job could
have had tokens. Interpreted (it wraps ``Batcher``); arguments as for ``fastserve sim``:

    FASTSERVE_COMPILED=0 python docs/bench-sim-queue/unfed_check.py sim --trace T.csv ...
"""

from __future__ import annotations

import atexit
import pathlib
import runpy
import sys

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2]))


def main() -> None:
    from scheduler_svc.core import batcher

    stats = {"steps": 0, "covered": 0, "left": 0, "left_tokens": 0}
    covers, form = batcher.Batcher._covers, batcher.Batcher.form
    seen: list[bool] = [False]

    def watched_covers(self, prefills, budget):
        covered = covers(self, prefills, budget)
        seen[0] = seen[0] or covered
        return covered

    def watched_form(self, step, num_live, num_waiting, num_waiting_single=0):
        seen[0] = False
        form(self, step, num_live, num_waiting, num_waiting_single)
        stats["steps"] += 1
        if seen[0]:
            stats["covered"] += 1
            left = self.config.max_batched_tokens - step.plan.num_batched_tokens
            slots = (step.max_batch or self.config.max_batch_size) - len(step.plan.commands)
            if left > 0 and slots > 0 and num_waiting > 0:
                stats["left"] += 1
                stats["left_tokens"] += left

    batcher.Batcher._covers = watched_covers
    batcher.Batcher.form = watched_form
    atexit.register(lambda: print("unfed check", stats, file=sys.stderr))
    sys.argv = ["fastserve", *sys.argv[1:]]
    runpy.run_module("fastserve.cli", run_name="__main__")


if __name__ == "__main__":
    main()
