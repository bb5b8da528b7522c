"""The native paged decode-attention kernel against a plain PyTorch reference."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from worker_svc.model import native

pytestmark = pytest.mark.skipif(native.library() is None, reason="no C compiler here")


def _reference(q, kb, vb, tables, lens, window, scale):
    batch, heads, dim = q.shape
    _, bs, kvh, _ = kb.shape
    length = tables.shape[1] * bs
    ks = kb.index_select(0, tables.view(-1)).view(batch, length, kvh, dim)
    vs = vb.index_select(0, tables.view(-1)).view(batch, length, kvh, dim)
    pos = torch.arange(length)[None]
    keep = pos < lens[:, None]
    if window:
        keep &= pos > lens[:, None] - 1 - window
    qg = q.view(batch, kvh, heads // kvh, dim)
    s = torch.einsum("bhgd,blhd->bhgl", qg, ks) * scale
    p = torch.softmax(s.masked_fill(~keep[:, None, None, :], float("-inf")), -1)
    return torch.einsum("bhgl,blhd->bhgd", p, vs).reshape(batch, heads, dim)


@pytest.mark.parametrize("window", [None, 7, 100])
@pytest.mark.parametrize("jobs", ["many", "one", "two"])
@pytest.mark.parametrize("heads,kv_heads,dim,block_size", [
    (9, 3, 64, 16), (4, 4, 32, 8), (8, 1, 16, 4),
    # Head size 64 has its own AVX-512 path: query rows per KV head taken 4 at a time.
    (16, 2, 64, 16), (10, 2, 64, 8), (4, 4, 64, 16)])
def test_matches_the_reference_on_scattered_blocks(window, jobs, heads, kv_heads, dim,
                                                   block_size):
    # Many jobs of mixed lengths (one task per job, longest first), or few (one task per KV
    # head of a job).
    g = torch.Generator().manual_seed(heads * 100 + dim)
    lens = torch.tensor({"many": [1, 5, block_size, block_size + 1, 97, 40], "one": [97],
                         "two": [40, 3]}[jobs])
    max_blocks = math.ceil(int(lens.max()) / block_size)
    kb = torch.randn(200, block_size, kv_heads, dim, generator=g)
    vb = torch.randn(200, block_size, kv_heads, dim, generator=g)
    tables = torch.randperm(200, generator=g)[: len(lens) * max_blocks].view(len(lens), -1)
    q = torch.randn(len(lens), heads, dim, generator=g)
    scale = dim ** -0.5
    out = native.paged_decode_attention(q, kb, vb, tables, lens, window, scale)
    torch.testing.assert_close(out, _reference(q, kb, vb, tables, lens, window, scale),
                               rtol=1e-5, atol=1e-5)


def test_other_dtypes_are_left_to_the_pytorch_path():
    q = torch.randn(1, 2, 8, dtype=torch.bfloat16)
    kb = torch.randn(4, 4, 2, 8, dtype=torch.bfloat16)
    assert native.paged_decode_attention(q, kb, kb, torch.zeros(1, 1, dtype=torch.long),
                                         torch.ones(1, dtype=torch.long), None, 1.0) is None


def test_loading_it_leaves_subnormal_floats_alone():
    # A library linked with -ffast-math would switch on flush-to-zero for the whole process.
    assert native.library() is not None
    tiny = np.float32(1e-40)
    assert tiny * np.float32(1.0) != 0.0
    assert torch.tensor(1e-40, dtype=torch.float32).item() != 0.0


@pytest.mark.parametrize("rows", [1, 7, 8, 9, 17])
@pytest.mark.parametrize("out_features,in_features", [(70, 33), (64, 576), (5, 8)])
def test_the_tiled_linear_matches_f_linear(rows, out_features, in_features):
    g = torch.Generator().manual_seed(rows + out_features)
    w = torch.randn(out_features, in_features, generator=g)
    b = torch.randn(out_features, generator=g)
    x = torch.randn(rows, in_features, generator=g)
    packed = native.small_gemm_pack(w)
    for bias in (b, None):
        torch.testing.assert_close(native.small_gemm(x, packed, out_features, bias),
                                   torch.nn.functional.linear(x, w, bias), rtol=1e-5, atol=1e-4)
