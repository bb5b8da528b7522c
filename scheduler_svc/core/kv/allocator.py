"""KV block allocation for one worker group: the scheduler chooses every block id."""

from __future__ import annotations

import math


def blocks_for(num_tokens: int, block_size: int) -> int:
    return math.ceil(num_tokens / block_size)


class BlockAllocator:
    """Free list of block ids ``[0, num_blocks)``; a predicate/action pair, no sentinels."""

    def __init__(self, num_blocks: int, block_size: int):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, "
                             f"{block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        # Popped from the end: low ids first, so a fresh pool hands out contiguous runs.
        self._free = list(range(num_blocks - 1, -1, -1))

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_blocks - len(self._free)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        assert self.can_allocate(n), f"allocate({n}) with {len(self._free)} free"
        if n == 0:
            return []
        taken = self._free[-n:]
        del self._free[-n:]
        taken.reverse()
        return taken

    def free(self, block_ids: list[int]) -> None:
        self._free.extend(reversed(block_ids))
        assert len(self._free) <= self.num_blocks, "a block was freed twice"
