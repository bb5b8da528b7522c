"""A Llama-family decoder (Llama 2/3, SmolLM, Qwen2, Mistral) over a paged KV pool.

All tokens of an iteration, from every job, prefill chunks and decodes alike, are packed into
one ``[T, hidden]`` matrix: projections and MLPs run once on exactly the tokens that need them
(no padding). Only attention is per job: prefill chunks one job at a time, decodes batched
over their gathered KV blocks.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from worker_svc.kv_pool import KVPool
from worker_svc.model import native
from worker_svc.model.config import ModelSpec
from worker_svc.model.linear import Linear, pick_kernel


@dataclass
class PrefillSegment:
    """A run of ``num_tokens`` new tokens of one job whose KV context has ``context_len``."""

    start: int  # index of its first token in the packed batch
    num_tokens: int
    context_len: int  # tokens in cache after this iteration, new ones included
    block_table: torch.Tensor  # [num_blocks_needed] int64, on device
    mask: torch.Tensor | None  # [num_tokens, context_len] bool, None = plain causal, no prefix


@dataclass
class DecodeGroup:
    """Jobs that each process exactly one token this iteration."""

    token_index: torch.Tensor  # [B] int64, their rows in the packed batch
    block_tables: torch.Tensor  # [B, max_blocks] int64 (padded rows point at block 0)
    context_lens: torch.Tensor  # [B] int64, cached tokens of each job, the new one included


@dataclass
class BatchMetadata:
    """Everything a forward pass needs besides the token ids; built once, used by every layer."""

    positions: torch.Tensor  # [T] int64
    slot_mapping: torch.Tensor  # [T] int64, where each new token's K/V goes in the pool
    prefills: list[PrefillSegment] = field(default_factory=list)
    decode: DecodeGroup | None = None
    logits_index: torch.Tensor | None = None  # [S] rows whose next-token logits are wanted
    # Layers whose output (the residual stream, before the next norm) is kept at the
    # ``logits_index`` rows, for a probe such as the output-length predictor; filled into
    # ``probes`` by the forward pass.
    probe_layers: tuple[int, ...] = ()
    probes: dict[int, torch.Tensor] = field(default_factory=dict)


class LlamaModel:
    """Weights as plain tensors and a forward pass; no nn.Module bookkeeping on the hot path."""

    def __init__(self, spec: ModelSpec, weights: dict[str, torch.Tensor], cos: torch.Tensor,
                 sin: torch.Tensor, linear_kernel: str = "auto",
                 all_reduce: Callable[[torch.Tensor], torch.Tensor] | None = None,
                 layers: range | None = None):
        # ``spec`` and ``weights`` are one tensor-parallel rank's shard when ``all_reduce``
        # (the group's sum over ranks) is given: the attention and MLP outputs are then
        # partial sums, completed by it (worker_svc/parallel/shard.py). ``layers`` are the
        # decoder layers of one pipeline stage (all of them by default): the first stage
        # embeds the tokens, the last one computes logits, the others pass the residual stream.
        self.spec = spec
        self._all_reduce = all_reduce
        s = spec
        self.layer_range = layers if layers is not None else range(s.num_layers)
        self.first_stage = self.layer_range.start == 0
        self.last_stage = self.layer_range.stop == s.num_layers
        # False on a group's ranks that do not sample: the LM head is skipped.
        self.computes_logits = self.last_stage
        self.embed = weights["model.embed_tokens.weight"] if self.first_stage else None
        head = None
        if self.last_stage:
            head = Linear(weights["model.embed_tokens.weight"] if s.tie_word_embeddings
                          else weights["lm_head.weight"])
        self.lm_head = head
        self.final_norm = weights["model.norm.weight"] if self.last_stage else None
        dtype = weights[f"model.layers.{self.layer_range.start}.input_layernorm.weight"].dtype
        self.dtype = dtype
        self.cos = cos.to(dtype).contiguous()
        self.sin = sin.to(dtype).contiguous()
        self.scale = s.head_dim ** -0.5
        self.layers = []
        for i in self.layer_range:
            p = f"model.layers.{i}."
            qkv = torch.cat([weights[p + f"self_attn.{n}_proj.weight"] for n in "qkv"], 0)
            qkv_bias = None
            if s.attention_bias:
                qkv_bias = torch.cat([weights[p + f"self_attn.{n}_proj.bias"] for n in "qkv"], 0)
            gate_up = torch.cat(
                [weights[p + "mlp.gate_proj.weight"], weights[p + "mlp.up_proj.weight"]], 0
            )
            self.layers.append(
                {
                    "in_norm": weights[p + "input_layernorm.weight"],
                    "qkv": Linear(qkv, qkv_bias),
                    "o": Linear(weights[p + "self_attn.o_proj.weight"],
                                weights.get(p + "self_attn.o_proj.bias")),
                    "post_norm": weights[p + "post_attention_layernorm.weight"],
                    "gate_up": Linear(gate_up),
                    "down": Linear(weights[p + "mlp.down_proj.weight"]),
                }
            )
        linears = [*([head] if head is not None else []),
                   *(v for layer in self.layers for v in layer.values() if isinstance(v, Linear))]
        # Timed on these very weights when "auto" (see linear.py).
        self.linear_kernel = pick_kernel(linears, linear_kernel)

    def use_group(self, all_reduce: Callable[[torch.Tensor], torch.Tensor]) -> None:
        """Sum the row-parallel outputs over a tensor-parallel group from now on."""
        self._all_reduce = all_reduce

    def _sum(self, partial: torch.Tensor) -> torch.Tensor:
        """A row-parallel output completed over the group's ranks (itself without a group)."""
        if self._all_reduce is None:
            return partial
        return self._all_reduce(partial.contiguous())

    def _rms_norm(self, x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
        # Same steps as transformers' LlamaRMSNorm: statistics in float32, cast back, scale.
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.spec.rms_norm_eps)
        return weight * xf.to(x.dtype)

    def _rope(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        # x: [T, heads, head_dim]; cos, sin: [T, 1, head_dim]
        half = x.shape[-1] // 2
        rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
        return x * cos + rotated * sin

    @torch.inference_mode()
    def forward(self, input_ids: torch.Tensor, meta: BatchMetadata, pool: KVPool,
                hidden: torch.Tensor | None = None) -> torch.Tensor:
        """Run the decoder on packed tokens; return logits ``[S, vocab]`` float32 for
        ``meta.logits_index`` rows, after writing every new token's K/V into ``pool``.

        A pipeline stage after the first starts from ``hidden`` (the previous stage's
        residual stream, ``[T, hidden]``) instead of the token ids; a stage before the last
        returns its residual stream instead of logits."""
        s = self.spec
        if hidden is None:
            assert self.embed is not None, "a later pipeline stage needs the residual stream"
            x = F.embedding(input_ids, self.embed)  # [T, hidden]
        else:
            x = hidden
        num_tokens = x.shape[0]
        q_size = s.num_heads * s.head_dim
        kv_size = s.num_kv_heads * s.head_dim
        qk_heads = s.num_heads + s.num_kv_heads
        # The fused native kernels (native.py) where they run; the positions are checked
        # here once, as the table lookup of the PyTorch path would.
        fused = (native.fused_usable(x) and num_tokens > 0
                 and int(meta.positions.max()) < self.cos.shape[0])
        eps = s.rms_norm_eps
        pending = None  # the last MLP's output, added to x by the next norm
        first = self.layer_range.start  # the pool holds this stage's layers only
        for i, layer in enumerate(self.layers):
            if fused:
                h = native.add_rms_norm(x, pending, layer["in_norm"], eps)
            else:
                if pending is not None:
                    x.add_(pending)  # x is this pass's own tensor: residuals add in place
                h = self._rms_norm(x, layer["in_norm"])
            qkv = layer["qkv"](h)
            # RoPE on the query and key heads at once: they are adjacent in the fused output.
            if fused:
                native.rope_(qkv, qk_heads, s.head_dim, self.cos, self.sin, meta.positions)
                qk = qkv[:, : q_size + kv_size].view(num_tokens, qk_heads, s.head_dim)
            else:
                cos = self.cos[meta.positions].unsqueeze(1)  # [T, 1, head_dim]
                sin = self.sin[meta.positions].unsqueeze(1)
                qk = self._rope(qkv[:, : q_size + kv_size].view(num_tokens, qk_heads,
                                                                  s.head_dim), cos, sin)
            q, k = qk[:, : s.num_heads], qk[:, s.num_heads :]
            v = qkv[:, q_size + kv_size :].view(num_tokens, s.num_kv_heads, s.head_dim)
            k_slots, v_slots = pool.layer_slots(i)
            k_slots.index_copy_(0, meta.slot_mapping, k)
            v_slots.index_copy_(0, meta.slot_mapping, v)
            attn = self._attention(i, q, k, v, meta, pool)  # [T, heads * head_dim]
            if fused:
                h = native.add_rms_norm(x, self._sum(layer["o"](attn)), layer["post_norm"], eps)
                pending = self._sum(layer["down"](native.silu_mul(layer["gate_up"](h))))
            else:
                pending = self._after_attention(x, attn, layer)
            if i + first in meta.probe_layers and meta.logits_index is not None:
                rows = meta.logits_index
                meta.probes[i + first] = x[rows] + pending[rows]
        if pending is not None:
            x.add_(pending)
        if not self.last_stage:
            return x
        assert self.final_norm is not None and self.lm_head is not None
        if (meta.logits_index is None or meta.logits_index.numel() == 0
                or not self.computes_logits):
            return torch.empty((0, s.vocab_size), dtype=torch.float32, device=x.device)
        x = self._rms_norm(x[meta.logits_index], self.final_norm)
        return self.lm_head(x).float()

    @torch.inference_mode()
    def hidden_at(self, input_ids: torch.Tensor, lengths: Sequence[int],
                  layer: int) -> torch.Tensor:
        """The residual stream after decoder ``layer`` at the last token of each segment of
        ``input_ids`` [T] (consecutive runs of ``lengths`` tokens, summing to T): ``[S,
        hidden]``, what ``BatchMetadata.probes[layer]`` holds for a sampled row.

        Each segment is a sequence of its own: positions 0..n-1, causal (and windowed)
        attention over its own tokens only, as the prefill of a prompt of those tokens alone
        computes them. No KV pool is read or written, and no layer after ``layer`` runs. The
        plain PyTorch steps of ``forward`` (no native kernels): its numbers up to float
        rounding. In a tensor-parallel group every rank calls it with the same arguments
        (each layer's two all-reduces are collective)."""
        s = self.spec
        assert self.embed is not None and layer in self.layer_range, \
            f"layer {layer} is not reachable from the embedding on this stage"
        assert len(lengths) > 0 and min(lengths) > 0 and sum(lengths) == input_ids.shape[0]
        dev = input_ids.device
        positions = torch.cat([torch.arange(n, device=dev) for n in lengths])
        cos = self.cos[positions].unsqueeze(1)  # [T, 1, head_dim]
        sin = self.sin[positions].unsqueeze(1)
        x = F.embedding(input_ids, self.embed)  # [T, hidden]
        num_tokens = x.shape[0]
        q_size = s.num_heads * s.head_dim
        kv_size = s.num_kv_heads * s.head_dim
        qk_heads = s.num_heads + s.num_kv_heads
        window = s.sliding_window
        pending = torch.zeros_like(x)
        for weights in self.layers[: layer - self.layer_range.start + 1]:
            x.add_(pending)
            h = self._rms_norm(x, weights["in_norm"])
            qkv = weights["qkv"](h)
            qk = self._rope(qkv[:, : q_size + kv_size].view(num_tokens, qk_heads, s.head_dim),
                            cos, sin)
            q, k = qk[:, : s.num_heads], qk[:, s.num_heads :]
            v = qkv[:, q_size + kv_size :].view(num_tokens, s.num_kv_heads, s.head_dim)
            attn = q.new_empty(q.shape)  # [T, heads, head_dim]
            start = 0
            for n in lengths:
                rows = slice(start, start + n)
                mask = None
                if window is not None and n > window:
                    pos = torch.arange(n, device=dev)
                    mask = (pos[None, :] <= pos[:, None]) & (pos[None, :] > pos[:, None] - window)
                attn[rows] = self._sdpa(q[rows], k[rows].transpose(0, 1).unsqueeze(0),
                                        v[rows].transpose(0, 1).unsqueeze(0), mask)
                start += n
            pending = self._after_attention(x, attn.view(num_tokens, -1), weights)
        last = torch.tensor(list(itertools.accumulate(lengths)), device=dev) - 1
        return x[last] + pending[last]

    def _after_attention(self, x: torch.Tensor, attn: torch.Tensor,
                         layer: dict) -> torch.Tensor:
        """The PyTorch steps after a layer's attention ``attn`` [T, heads * head_dim]: its output
        projection added to the residual stream ``x`` (in place), then the MLP; returns the
        MLP's output, which the next norm adds to ``x``."""
        x.add_(self._sum(layer["o"](attn)))
        h = self._rms_norm(x, layer["post_norm"])
        gate, up = layer["gate_up"](h).chunk(2, dim=-1)
        return self._sum(layer["down"](F.silu(gate) * up))

    def _attention(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   meta: BatchMetadata, pool: KVPool) -> torch.Tensor:
        s = self.spec
        out = q.new_empty(q.shape)  # [T, heads, head_dim], contiguous
        k_blocks, v_blocks = pool.layer_blocks(layer)  # [num_blocks, block_size, kvh, d]
        for seg in meta.prefills:
            rows = slice(seg.start, seg.start + seg.num_tokens)
            # On the CPU in float32, the native kernel reads the job's keys and values in
            # place from the pool (this pass's were written above), causal and windowed.
            if native.prefill_attention(q[rows], out[rows], k_blocks, v_blocks,
                                        seg.block_table, seg.context_len, s.sliding_window,
                                        self.scale):
                continue
            if seg.mask is None:
                ks = k[rows].transpose(0, 1).unsqueeze(0)  # [1, kvh, n, d]
                vs = v[rows].transpose(0, 1).unsqueeze(0)
            else:
                ks = _gather(k_blocks, seg.block_table, seg.context_len)
                vs = _gather(v_blocks, seg.block_table, seg.context_len)
            out[rows] = self._sdpa(q[rows], ks, vs, seg.mask)
        if meta.decode is not None:
            d = meta.decode
            qd = q.index_select(0, d.token_index)  # [B, heads, d]
            out.index_copy_(0, d.token_index, self._decode_attention(qd, k_blocks, v_blocks, d))
        return out.view(q.shape[0], -1)

    def _sdpa(self, q: torch.Tensor, ks: torch.Tensor, vs: torch.Tensor,
              mask: torch.Tensor | None) -> torch.Tensor:
        """One sequence's attention with SDPA: ``q`` [n, heads, d] against ``ks``, ``vs``
        [1, kv_heads, L, d]; plain causal (L == n) when ``mask`` [n, L] is None. Returns
        [n, heads, d]."""
        group = self.spec.num_heads // self.spec.num_kv_heads
        if group > 1:
            # The KV heads repeated for their query heads, as enable_gqa does: the same
            # numbers, and PyTorch's CPU flash kernel ran ~10% faster on them.
            ks = ks.repeat_interleave(group, dim=1)
            vs = vs.repeat_interleave(group, dim=1)
        qs = q.transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
        o = F.scaled_dot_product_attention(qs, ks, vs, is_causal=mask is None and q.shape[0] > 1,
                                           attn_mask=mask, scale=self.scale)
        return o[0].transpose(0, 1)

    def _decode_attention(self, q: torch.Tensor, k_blocks: torch.Tensor, v_blocks: torch.Tensor,
                          d: DecodeGroup) -> torch.Tensor:
        """One query per job against its gathered blocks; returns ``[B, heads, head_dim]``.

        On the CPU in float32 this is the native kernel (native.py), which reads the blocks
        in place. Otherwise it is written as batched matmuls rather than SDPA: for a single
        query row, PyTorch's CPU flash-attention kernel spends far more time in setup than in
        arithmetic. The matmuls run one KV head at a time on strided views of the gathered
        ``[B, L, kv_heads, d]`` blocks, which BLAS reads in place; one matmul over all heads
        would first copy the whole gathered KV into a head-major layout (measured: a third of
        the attention time).
        """
        s = self.spec
        out = native.paged_decode_attention(q, k_blocks, v_blocks, d.block_tables,
                                            d.context_lens, s.sliding_window, self.scale)
        if out is not None:
            return out
        batch, max_blocks = d.block_tables.shape
        length = max_blocks * k_blocks.shape[1]
        group = s.num_heads // s.num_kv_heads
        flat = d.block_tables.view(-1)
        ks = k_blocks.index_select(0, flat).view(batch, length, s.num_kv_heads, s.head_dim)
        vs = v_blocks.index_select(0, flat).view(batch, length, s.num_kv_heads, s.head_dim)
        qg = q.view(batch, s.num_kv_heads, group, s.head_dim)
        k_pos = torch.arange(length, device=q.device)[None, :]
        ctx = d.context_lens[:, None]
        masked_out = k_pos >= ctx  # [B, L]: past each job's tokens, or before its window
        if s.sliding_window is not None:
            masked_out |= k_pos <= ctx - 1 - s.sliding_window
        masked_out = masked_out.view(batch, 1, length)
        out = q.new_empty((s.num_kv_heads, batch, group, s.head_dim))
        for h in range(s.num_kv_heads):
            scores = torch.bmm(qg[:, h], ks[:, :, h].transpose(1, 2))  # [B, group, L]
            scores.mul_(self.scale).masked_fill_(masked_out, float("-inf"))
            torch.bmm(torch.softmax(scores, dim=-1), vs[:, :, h], out=out[h])
        return out.transpose(0, 1).reshape(batch, s.num_heads, s.head_dim)


def _gather(blocks: torch.Tensor, block_table: torch.Tensor, length: int) -> torch.Tensor:
    """One job's first ``length`` cached tokens as ``[1, kv_heads, length, head_dim]``."""
    g = blocks.index_select(0, block_table)  # [n, block_size, kvh, d]
    g = g.view(-1, g.shape[2], g.shape[3])[:length]
    return g.transpose(0, 1).unsqueeze(0)
