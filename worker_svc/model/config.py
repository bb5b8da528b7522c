"""What the runner needs to know about a Llama-family model, read from a transformers config."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

SUPPORTED_MODEL_TYPES = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class ModelSpec:
    model_type: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    attention_bias: bool
    mlp_bias: bool
    sliding_window: int | None
    eos_token_ids: tuple[int, ...]

    @classmethod
    def from_hf_config(cls, config: Any, generation_config: Any = None) -> ModelSpec:
        model_type = getattr(config, "model_type", "")
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(
                f"model_type {model_type!r} is not supported; supported: {SUPPORTED_MODEL_TYPES}"
            )
        act = getattr(config, "hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported; only 'silu' (SwiGLU)")
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        sliding = getattr(config, "sliding_window", None)
        if model_type == "qwen2" and not getattr(config, "use_sliding_window", False):
            sliding = None
        attention_bias = bool(getattr(config, "attention_bias", model_type == "qwen2"))
        return cls(
            model_type=model_type,
            vocab_size=config.vocab_size,
            hidden_size=config.hidden_size,
            intermediate_size=config.intermediate_size,
            num_layers=config.num_hidden_layers,
            num_heads=num_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=head_dim,
            rms_norm_eps=config.rms_norm_eps,
            max_position_embeddings=config.max_position_embeddings,
            tie_word_embeddings=bool(getattr(config, "tie_word_embeddings", False)),
            attention_bias=attention_bias,
            mlp_bias=bool(getattr(config, "mlp_bias", False)),
            sliding_window=sliding,
            eos_token_ids=_eos_ids(config, generation_config),
        )


def _eos_ids(config: Any, generation_config: Any) -> tuple[int, ...]:
    ids: list[int] = []
    for src in (generation_config, config):
        value = getattr(src, "eos_token_id", None) if src is not None else None
        if value is None:
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if int(v) not in ids:
                ids.append(int(v))
    return tuple(ids)


def rope_tables(config: Any, max_positions: int,
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin for positions ``[0, max_positions)``, ``[max_positions, head_dim]`` float32.

    The inverse frequencies come from transformers' own RoPE initialisers, so every static
    scaling variant it knows (default, linear, llama3, yarn, longrope) is computed as it does.
    """
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    scaling = getattr(config, "rope_scaling", None) or {}
    rope_type = scaling.get("rope_type", scaling.get("type", "default"))
    if rope_type == "dynamic":
        raise ValueError(
            "rope_scaling type 'dynamic' changes frequencies with sequence length and is not "
            "supported; use a static variant (linear, llama3, yarn)"
        )
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"rope_scaling type {rope_type!r} is unknown to transformers")
    inv_freq, attention_scaling = ROPE_INIT_FUNCTIONS[rope_type](config, torch.device("cpu"))
    positions = torch.arange(max_positions, dtype=torch.float32)
    # Same operation order as transformers' rotary embedding: freqs = inv_freq x position.
    freqs = positions[:, None] * inv_freq.float()[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    cos = emb.cos() * attention_scaling
    sin = emb.sin() * attention_scaling
    return cos.to(device), sin.to(device)
