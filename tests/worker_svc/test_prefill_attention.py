"""The native prefill attention kernel (csrc/prefill_attention.c) against PyTorch's SDPA on
the same keys and values: whole prompts and later chunks, sliding windows, grouped and plain
heads, the head size with its own vector code and others, keys scattered over the pool."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from worker_svc.model import native

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler here")

BLOCK = 16


def _case(n, ctx, heads, kv_heads, dim, seed):
    """n new query rows (strided, as views of a fused QKV), a pool holding ctx tokens of one
    job in shuffled blocks, and the same keys and values laid out for SDPA."""
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(n, (heads + 2 * kv_heads) * dim, generator=g)
    q = qkv[:, : heads * dim].view(n, heads, dim)
    keys = torch.randn(ctx, kv_heads, dim, generator=g)
    values = torch.randn(ctx, kv_heads, dim, generator=g)
    num_blocks = (ctx + BLOCK - 1) // BLOCK
    pool_blocks = num_blocks + 5
    table = torch.randperm(pool_blocks, generator=g)[:num_blocks]
    k_blocks = torch.full((pool_blocks, BLOCK, kv_heads, dim), float("nan"))
    v_blocks = torch.full((pool_blocks, BLOCK, kv_heads, dim), float("nan"))
    slots = (table[:, None] * BLOCK + torch.arange(BLOCK)).reshape(-1)[:ctx]
    k_blocks.view(-1, kv_heads, dim).index_copy_(0, slots, keys)
    v_blocks.view(-1, kv_heads, dim).index_copy_(0, slots, values)
    return q, keys, values, k_blocks, v_blocks, table


def _reference(q, keys, values, window, scale):
    n, ctx = q.shape[0], keys.shape[0]
    q_pos = torch.arange(ctx - n, ctx)[:, None]
    k_pos = torch.arange(ctx)[None, :]
    mask = k_pos <= q_pos
    if window:
        mask &= k_pos > q_pos - window
    o = F.scaled_dot_product_attention(
        q.transpose(0, 1)[None], keys.transpose(0, 1)[None], values.transpose(0, 1)[None],
        attn_mask=mask, scale=scale, enable_gqa=True)
    return o[0].transpose(0, 1)


@pytest.mark.parametrize(("n", "ctx", "window"), [
    (1, 1, None), (17, 17, None), (436, 436, None),  # whole prompts
    (100, 612, None), (1, 300, None), (33, 40, None),  # later chunks over cached tokens
    (200, 200, 50), (64, 500, 100), (20, 20, 7),  # sliding windows
])
@pytest.mark.parametrize(("heads", "kv_heads", "dim"), [(9, 3, 64), (4, 4, 64), (6, 2, 32)])
def test_prefill_attention_matches_sdpa(n, ctx, window, heads, kv_heads, dim):
    q, keys, values, k_blocks, v_blocks, table = _case(n, ctx, heads, kv_heads, dim, n + ctx)
    scale = dim ** -0.5
    out = torch.full((n, heads, dim), float("nan"))
    assert native.prefill_attention(q, out, k_blocks, v_blocks, table, ctx, window, scale)
    torch.testing.assert_close(out, _reference(q, keys, values, window, scale),
                               rtol=1e-5, atol=2e-6)


def test_prefill_attention_declines_what_it_cannot_run():
    q, _, _, k_blocks, v_blocks, table = _case(8, 8, 4, 2, 64, 0)
    out = torch.empty(8, 4, 64)
    half = torch.empty(8, 4, 64, dtype=torch.float64)
    assert not native.prefill_attention(q.double(), half, k_blocks.double(), v_blocks.double(),
                                        table, 8, None, 0.125)
    # heads not contiguous within a row: the kernel would read the wrong numbers
    assert not native.prefill_attention(q[:, ::2], torch.empty(8, 2, 64), k_blocks, v_blocks,
                                        table, 8, None, 0.125)
    assert not native.prefill_attention(q, out.transpose(0, 1), k_blocks, v_blocks, table, 8,
                                        None, 0.125)
