"""The timing of a simulated pipeline: P stages in a row, batches through them in order.

A batch holds each stage for its stage time (``CostModel.stage_time``) and enters a stage
when it has left the one before and the batch ahead has left this one (a flow shop: no batch
overtakes another, as the real stages pass activations down one link in order). With equal
stage times a batch ends P stage times after it starts and a full pipeline ends one every
stage time; a slow batch holds up the faster ones behind it, stage by stage, as it would on
the devices.

The simulator asks ``stage_free_at(0)`` when the next batch could start, ``start()`` s it
with its plan and answer, and settles the batches in the order they end (``next_end``,
``pop``).
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from scheduler_svc.core.contract import StepPlan, TokenResult


@dataclass
class InFlight:
    """A batch in the pipeline: its plan, the worker's answer for it, and its times."""

    plan: StepPlan
    results: list[TokenResult]
    start: float  # it entered the first stage (after its uploads)
    end: float  # it leaves the last stage: its tokens are back
    swap_wait_s: float


class Pipeline:
    """``num_stages`` stages and the batches in them, oldest first."""

    def __init__(self, num_stages: int, start: float = 0.0):
        if num_stages < 1:
            raise ValueError(f"a pipeline needs >= 1 stage, got {num_stages}")
        self._free_at = [start] * num_stages  # each stage is busy until then
        self._batches: deque[InFlight] = deque()

    def __len__(self) -> int:
        return len(self._batches)

    def stage_free_at(self, stage: int) -> float:
        return self._free_at[stage]

    @property
    def next_end(self) -> float:
        """When the oldest batch leaves the last stage (inf when none is in)."""
        return self._batches[0].end if self._batches else math.inf

    def start(self, plan: StepPlan, results: list[TokenResult], ready: float, stage_s: float,
              swap_wait_s: float = 0.0) -> InFlight:
        """Send a batch in, ready to enter the first stage at ``ready``; each stage holds it
        ``stage_s``. Returns it, with the time it ends."""
        entered = t = max(ready, self._free_at[0])
        for i, free_at in enumerate(self._free_at):
            t = max(t, free_at) + stage_s
            self._free_at[i] = t
        batch = InFlight(plan, results, entered, t, swap_wait_s)
        self._batches.append(batch)
        return batch

    def pop(self) -> InFlight:
        """The oldest batch, out of the pipeline (the one ``next_end`` names)."""
        return self._batches.popleft()
