"""Prefill attention, one layer of the default model's shape (9 heads, 3 KV heads, size 64):
PyTorch SDPA (flash, enable_gqa) against the native kernel reading a shuffled paged pool.

    python docs/bench-fused/attn_bench.py PROMPT_TOKENS
"""

from __future__ import annotations

import sys
import time

import torch
import torch.nn.functional as F

from worker_svc.model import native

HEADS, KV_HEADS, DIM, BLOCK = 9, 3, 64, 16


def main() -> None:
    torch.set_num_threads(2)
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 436
    scale = DIM ** -0.5
    qkv = torch.randn(n, (HEADS + 2 * KV_HEADS) * DIM)
    q = qkv[:, : HEADS * DIM].view(n, HEADS, DIM)
    k = qkv[:, HEADS * DIM : (HEADS + KV_HEADS) * DIM].view(n, KV_HEADS, DIM)
    v = qkv[:, (HEADS + KV_HEADS) * DIM :].view(n, KV_HEADS, DIM)
    num_blocks = (n + BLOCK - 1) // BLOCK
    table = torch.randperm(num_blocks + 3)[:num_blocks]
    k_blocks = torch.zeros(num_blocks + 3, BLOCK, KV_HEADS, DIM)
    v_blocks = torch.zeros_like(k_blocks)
    slots = (table[:, None] * BLOCK + torch.arange(BLOCK)).view(-1)[:n]
    k_blocks.view(-1, KV_HEADS, DIM).index_copy_(0, slots, k)
    v_blocks.view(-1, KV_HEADS, DIM).index_copy_(0, slots, v)
    out = torch.empty(n, HEADS, DIM)

    def sdpa() -> torch.Tensor:
        o = F.scaled_dot_product_attention(
            q.transpose(0, 1)[None], k.transpose(0, 1)[None], v.transpose(0, 1)[None],
            is_causal=True, scale=scale, enable_gqa=True)
        return o[0].transpose(0, 1)

    def kernel() -> torch.Tensor:
        assert native.prefill_attention(q, out, k_blocks, v_blocks, table, n, None, scale)
        return out

    print(f"max difference {(kernel() - sdpa()).abs().max().item():.2e}")
    for f in (sdpa, kernel):
        for _ in range(3):
            f()
        start, reps = time.perf_counter(), 30
        for _ in range(reps):
            f()
        print(f"{f.__name__:7s} {(time.perf_counter() - start) / reps * 1e3:.3f} ms per layer")


if __name__ == "__main__":
    main()
