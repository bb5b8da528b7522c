"""The worker's preallocated paged KV pool.

Block ids are chosen by the scheduler; the pool only stores tensors and checks ownership.
Layout: ``[layers, 2 (k, v), num_blocks, block_size, kv_heads, head_dim]`` so that one
layer's keys flatten to ``[num_blocks * block_size, kv_heads, head_dim]`` (a slot per token)
and a block is a contiguous ``block_size * kv_heads * head_dim`` run for gathers and swaps.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch


class ClaimProblem(enum.Enum):
    INVALID = "invalid"  # malformed: out of range, duplicated
    IN_USE = "in_use"  # held by another job
    EXHAUSTED = "exhausted"  # more blocks than the pool has free


@dataclass(frozen=True)
class KVPoolConfig:
    num_layers: int
    num_kv_heads: int
    head_dim: int
    num_blocks: int
    block_size: int

    def __post_init__(self) -> None:
        for name in ("num_layers", "num_kv_heads", "head_dim", "num_blocks", "block_size"):
            value = getattr(self, name)
            if value < 1:
                raise ValueError(f"KV pool {name} must be >= 1, got {value}")

    def bytes_per_block(self, dtype: torch.dtype) -> int:
        elem = torch.empty((), dtype=dtype).element_size()
        return self.num_layers * 2 * self.block_size * self.num_kv_heads * self.head_dim * elem


class KVPool:
    """Fixed-size blocks of K and V for every layer, plus which job owns each block."""

    def __init__(self, config: KVPoolConfig, device: torch.device, dtype: torch.dtype):
        self.config = config
        self.device = device
        self.dtype = dtype
        c = config
        self.data = torch.zeros(
            (c.num_layers, 2, c.num_blocks, c.block_size, c.num_kv_heads, c.head_dim),
            device=device,
            dtype=dtype,
        )
        self._owner: dict[int, int] = {}

    @property
    def num_blocks(self) -> int:
        return self.config.num_blocks

    @property
    def block_size(self) -> int:
        return self.config.block_size

    @property
    def num_used_blocks(self) -> int:
        return len(self._owner)

    def layer_slots(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of one layer as ``[num_blocks * block_size, kv_heads, head_dim]``."""
        c = self.config
        shape = (c.num_blocks * c.block_size, c.num_kv_heads, c.head_dim)
        return self.data[layer, 0].view(shape), self.data[layer, 1].view(shape)

    def layer_blocks(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys and values of one layer as ``[num_blocks, block_size, kv_heads, head_dim]``."""
        return self.data[layer, 0], self.data[layer, 1]

    def check_claim(self, job_id: int, block_ids: list[int]) -> tuple[ClaimProblem, str] | None:
        """Why ``job_id`` may not take ``block_ids``, or None if it may."""
        c = self.config
        if len(block_ids) > c.num_blocks:
            return ClaimProblem.EXHAUSTED, (
                f"{len(block_ids)} blocks requested; the pool has {c.num_blocks}"
            )
        if len(self._owner) + len(block_ids) > c.num_blocks:
            return ClaimProblem.EXHAUSTED, (
                f"{len(block_ids)} more blocks requested but only "
                f"{c.num_blocks - len(self._owner)} of {c.num_blocks} are free"
            )
        seen: set[int] = set()
        for b in block_ids:
            if not 0 <= b < c.num_blocks:
                return ClaimProblem.INVALID, f"block id {b} out of range [0, {c.num_blocks})"
            if b in seen:
                return ClaimProblem.INVALID, f"block id {b} listed twice"
            seen.add(b)
            owner = self._owner.get(b)
            if owner == job_id:
                return ClaimProblem.INVALID, f"block id {b} is already held by this job"
            if owner is not None:
                return ClaimProblem.IN_USE, f"block id {b} is in use by job {owner}"
        return None

    def claim(self, job_id: int, block_ids: list[int]) -> None:
        for b in block_ids:
            assert b not in self._owner, f"block {b} already owned"
            self._owner[b] = job_id

    def release(self, block_ids: list[int]) -> None:
        for b in block_ids:
            self._owner.pop(b, None)
