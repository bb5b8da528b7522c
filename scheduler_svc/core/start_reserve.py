"""The free blocks a new job must leave as it starts: the batcher's start reserve.

Under a policy whose arrivals preempt, started jobs are paused for new ones, and their KV
stays on the device unless the KV policy can move it (a store with room for it, or drops
within the recompute budget). Such paused KV is memory the batch cannot use, so a new job
leaves room for it:

| rule          | blocks left free                                                          |
|---------------|---------------------------------------------------------------------------|
| always        | the watermark                                                             |
| growth        | ``kv_growth_reserve`` per job holding KV, while paused KV has nowhere to   |
|               | go: each start adds a holder, and once holders fill the pool none grows   |
| pause         | once holders fill the batch (a start pauses one) and new jobs cannot move |
|               | paused KV (defer, recompute past its budget, no store): a holder's mean KV |
| memory bound  | within ``kv_memory_bound_iterations`` of a Step whose batch had a free    |
|               | slot and a started job short of blocks: the mean KV of every holder the   |
|               | batch cannot take, so paused KV never takes the blocks the batch needs    |
"""

from __future__ import annotations

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.kv.ledger import KVLedger
from scheduler_svc.core.kv.policies import KVPolicy


class StartReserve:
    def __init__(self, config: SchedulerConfig, ledger: KVLedger, kv_policy: KVPolicy):
        self.config = config
        self.ledger = ledger
        self.kv_policy = kv_policy
        self.watermark_blocks = int(config.watermark * ledger.allocator.num_blocks)
        # The group's iteration count up to which memory counts as bounding the batch.
        self._bound_until = 0

    def blocks(self, arrivals_preempt: bool, max_batch: int, iterations: int) -> int:
        """The reserve for a Step formed after ``iterations`` iterations of the group.

        Growth: 200 blocks at 1.26x capacity gave 62-101 recomputes for 64 requests and
        0.83-0.91x FCFS's tokens/s; with 3 per holder 21-30, 0.96-0.98x. A store with a few
        blocks free counted as room: ShareGPT at 3x filled it and paused jobs sat on the full
        device at a block boundary (skip-join 0.949x FCFS, 193 recomputes; now 0.960x, 59).
        Pause and memory bound: under defer on ShareGPT lengths at 1.5x and 3x, the MLFQs'
        paused jobs held a fifth of the device in the drain while the batch ran short of
        blocks (0.93-0.95x FCFS's tokens/s; now 0.96-0.97x)."""
        ledger, kvp = self.ledger, self.kv_policy
        per_job = self.config.kv_growth_reserve
        if not per_job or not arrivals_preempt:
            return self.watermark_blocks
        holders = len(ledger.holding)
        used = ledger.allocator.num_used
        if kvp.swapping() and ledger.store_free() * holders > used:
            return self.watermark_blocks  # the store can take a holder's mean KV
        reserve = per_job * holders
        if holders >= max_batch and not self._can_move(kvp):
            beyond = holders - max_batch + 1 if iterations < self._bound_until else 1
            reserve = max(reserve, beyond * used // holders)
        return max(self.watermark_blocks, reserve)

    @staticmethod
    def _can_move(kvp: KVPolicy) -> bool:
        """Whether new jobs can move paused KV out of the way at all: a swapping policy with
        its store up (a short store bounds what they move), or drops within the budget.
        Otherwise the pause and memory-bound rules hold (making room for them instead
        would move more KV, not less)."""
        return kvp.swapping() or (kvp.drops and kvp.drop_allowance() >= 0)

    def observe(self, memory_bound: bool, iterations: int) -> None:
        """A Step's batch is formed: whether memory bounded it (a slot was free and a started
        job was short of blocks, under a policy whose arrivals preempt)."""
        if memory_bound:
            self._bound_until = iterations + self.config.kv_memory_bound_iterations

    def steady_limit(self, iterations: int) -> int | None:
        """Iterations from the group's ``iterations`` over which the rules stay as they are
        (a memory-bound window open at the last plan does not close), or None when none is
        open. A fast-forward never starts from a memory-bound Step: its started job left out
        of the batch makes the plan one that does not repeat (``steady.repeatable``), so no
        Step it skips would have reopened the window."""
        if self._bound_until <= iterations - 1:
            return None
        return max(self._bound_until - iterations, 0)
