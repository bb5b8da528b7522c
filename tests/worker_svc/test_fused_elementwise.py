"""The fused elementwise kernels (RMSNorm with residual add, SiLU-and-multiply, RoPE) against
the PyTorch steps they replace, and the model's two paths against each other."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from worker_svc.loader import EngineConfig, load_engine
from worker_svc.model import native
from worker_svc.model.llama import BatchMetadata, DecodeGroup, PrefillSegment

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler here")


def _rms(x, w, eps):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("rows", [1, 3, 16, 437])
@pytest.mark.parametrize("with_delta", [False, True])
def test_add_rms_norm_matches_pytorch_and_adds_in_place(rows, with_delta):
    g = torch.Generator().manual_seed(rows)
    x = torch.randn(rows, 576, generator=g) * 3
    delta = torch.randn(rows, 576, generator=g) if with_delta else None
    w = torch.randn(576, generator=g)
    expect_x = x + delta if with_delta else x.clone()
    out = native.add_rms_norm(x, delta, w, 1e-5)
    torch.testing.assert_close(x, expect_x, rtol=0, atol=0)  # x now holds the sum
    torch.testing.assert_close(out, _rms(expect_x, w, 1e-5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("rows", [1, 8, 300])
def test_silu_mul_matches_pytorch_even_far_out(rows):
    g = torch.Generator().manual_seed(rows)
    gate_up = torch.randn(rows, 2 * 1536, generator=g) * 4
    gate_up[0, :4] = torch.tensor([-200.0, -89.0, 90.0, 0.0])  # exp would overflow at -200
    gate, up = gate_up.chunk(2, dim=-1)
    got = native.silu_mul(gate_up)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("rows", [1, 5, 200])
def test_rope_rotates_only_the_first_heads_in_place(rows):
    g = torch.Generator().manual_seed(rows)
    heads, kv, dim = 9, 3, 64
    x = torch.randn(rows, (heads + 2 * kv) * dim, generator=g)
    cos, sin = torch.randn(1000, dim, generator=g), torch.randn(1000, dim, generator=g)
    pos = torch.randint(0, 1000, (rows,), generator=g)
    qk = x[:, : (heads + kv) * dim].reshape(rows, heads + kv, dim)
    c, s = cos[pos].unsqueeze(1), sin[pos].unsqueeze(1)
    rotated = torch.cat((-qk[..., dim // 2:], qk[..., : dim // 2]), dim=-1)
    expect = x.clone()
    expect[:, : (heads + kv) * dim] = (qk * c + rotated * s).reshape(rows, -1)
    native.rope_(x, heads + kv, dim, cos, sin, pos)
    torch.testing.assert_close(x, expect, rtol=1e-5, atol=1e-5)


def test_the_model_gives_the_same_logits_on_both_paths(tiny_llama_dir, monkeypatch):
    engine = load_engine(EngineConfig(model=str(tiny_llama_dir), num_blocks=64)).engine
    pool = engine.pool
    n, bs = 37, pool.block_size
    table = torch.arange((n + 1 + bs - 1) // bs)
    slots = table.repeat_interleave(bs)[: n + 1] * bs + torch.arange(n + 1) % bs
    ids = torch.randint(0, 256, (n + 1,), generator=torch.Generator().manual_seed(3))
    prefill = BatchMetadata(
        positions=torch.arange(n), slot_mapping=slots[:n],
        prefills=[PrefillSegment(0, n, n, table, None)], logits_index=torch.tensor([n - 1]))
    decode = BatchMetadata(
        positions=torch.tensor([n]), slot_mapping=slots[n:],
        decode=DecodeGroup(torch.tensor([0]), table[None], torch.tensor([n + 1])),
        logits_index=torch.tensor([0]))
    results = []
    for fused in (True, False):
        if not fused:
            monkeypatch.setattr(native, "fused_usable", lambda x: False)
        results.append((engine.model.forward(ids[:n], prefill, pool),
                        engine.model.forward(ids[n:], decode, pool)))
    for got, expect in zip(results[0], results[1]):
        torch.testing.assert_close(got, expect, rtol=1e-4, atol=1e-4)
