"""Megatron-style shards of a Llama-family model for one tensor-parallel rank.

Rank r of T holds query heads ``[r*H/T, (r+1)*H/T)``, the KV heads they read
``[r*K/T, (r+1)*K/T)`` (so its KV pool holds those heads only) and 1/T of the MLP's
intermediate units. The q, k, v, gate and up projections split by output rows (column
parallel); o_proj and down_proj split by input columns (row parallel), so each rank's output of
those is a partial sum, and one all-reduce after attention and one after the MLP give every rank
the whole residual stream. Norms, embeddings and the LM head are replicated. A row-parallel
bias is added once, by rank 0.
"""

from __future__ import annotations

import dataclasses

import torch

from worker_svc.model.config import ModelSpec


def check_tensor_parallel(spec: ModelSpec, size: int) -> None:
    """Raise ValueError, naming the numbers, when ``size`` ranks cannot split ``spec``."""
    if size < 1:
        raise ValueError(f"tensor_parallel_size must be >= 1, got {size}")
    for what, n in (("KV heads", spec.num_kv_heads), ("attention heads", spec.num_heads),
                    ("MLP intermediate units", spec.intermediate_size)):
        if n % size:
            raise ValueError(
                f"tensor_parallel_size {size} must divide the model's {n} {what}; "
                f"with {spec.num_kv_heads} KV heads, choose a divisor of {spec.num_kv_heads}")


def shard_spec(spec: ModelSpec, size: int) -> ModelSpec:
    """The spec one rank computes with: 1/size of the heads and of the MLP."""
    check_tensor_parallel(spec, size)
    return dataclasses.replace(spec, num_heads=spec.num_heads // size,
                               num_kv_heads=spec.num_kv_heads // size,
                               intermediate_size=spec.intermediate_size // size)


def shard_rule(name: str, spec: ModelSpec, rank: int,
               size: int) -> tuple[int, int, int] | bool | None:
    """What rank ``rank`` of ``size`` keeps of the tensor ``name``: ``(dim, start, stop)`` for
    a slice, True for the whole tensor, None for nothing (a row-parallel bias off rank 0)."""
    if size == 1:
        return True
    d = spec.head_dim
    rows = {
        "self_attn.q_proj": spec.num_heads * d // size,
        "self_attn.k_proj": spec.num_kv_heads * d // size,
        "self_attn.v_proj": spec.num_kv_heads * d // size,
        "mlp.gate_proj": spec.intermediate_size // size,
        "mlp.up_proj": spec.intermediate_size // size,
    }
    cols = {"self_attn.o_proj": spec.num_heads * d // size,
            "mlp.down_proj": spec.intermediate_size // size}
    parts = name.rsplit(".", 1)
    module = parts[0].split(".", 3)[-1] if name.startswith("model.layers.") else ""
    kind = parts[-1]
    if module in rows:  # column parallel: its output rows (and bias) split
        n = rows[module]
        return 0, rank * n, (rank + 1) * n
    if module in cols and kind == "weight":  # row parallel: its input columns split
        n = cols[module]
        return 1, rank * n, (rank + 1) * n
    if module in cols:  # a row-parallel bias: added once, after the sum, by rank 0
        return True if rank == 0 else None
    return True


def shard_weights(weights: dict[str, torch.Tensor], spec: ModelSpec, rank: int,
                  size: int) -> dict[str, torch.Tensor]:
    """Rank ``rank``'s slices of a transformers Llama state dict (contiguous copies)."""
    check_tensor_parallel(spec, size)
    if not 0 <= rank < size:
        raise ValueError(f"tensor_parallel_rank must be in [0, {size}), got {rank}")
    if size == 1:
        return weights
    out: dict[str, torch.Tensor] = {}
    for name, w in weights.items():
        rule = shard_rule(name, spec, rank, size)
        if rule is True:
            out[name] = w
        elif rule is not None:
            dim, start, stop = rule
            out[name] = w.narrow(dim, start, stop - start).contiguous()
    return out


def check_pipeline_parallel(spec: ModelSpec, stages: int) -> None:
    """Raise ValueError, naming the numbers, when ``stages`` cannot split ``spec``'s layers."""
    if stages < 1:
        raise ValueError(f"pipeline_parallel_size must be >= 1, got {stages}")
    if stages > spec.num_layers:
        raise ValueError(f"pipeline_parallel_size {stages} is more than the model's "
                         f"{spec.num_layers} layers: each stage needs at least one")


def stage_layers(num_layers: int, stages: int, stage: int) -> range:
    """The contiguous decoder layers of pipeline stage ``stage``: as even as they divide, the
    earlier stages taking one more when they do not (the first also embeds, the last also
    computes logits)."""
    base, extra = divmod(num_layers, stages)
    start = stage * base + min(stage, extra)
    return range(start, start + base + (1 if stage < extra else 0))


def stage_keeps(name: str, spec: ModelSpec, layers: range) -> bool:
    """Whether a stage holding ``layers`` needs the tensor ``name``: its layers' own, the
    embeddings on the first stage (and on the last when the LM head is tied to them), the
    final norm and LM head on the last."""
    first, last = layers.start == 0, layers.stop == spec.num_layers
    if name.startswith("model.layers."):
        return int(name.split(".", 3)[2]) in layers
    if name == "model.embed_tokens.weight":
        return first or (last and spec.tie_word_embeddings)
    return last  # model.norm, lm_head


def stage_weights(weights: dict[str, torch.Tensor], spec: ModelSpec,
                  layers: range) -> dict[str, torch.Tensor]:
    """The weights of ``weights`` a stage holding ``layers`` needs (``stage_keeps``)."""
    return {name: w for name, w in weights.items() if stage_keeps(name, spec, layers)}
