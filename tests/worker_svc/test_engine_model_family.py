"""Llama-family variants match transformers: Qwen2 (QKV bias), Mistral (sliding window),
Llama 3 RoPE scaling, tied embeddings."""

from __future__ import annotations

import random

import pytest
import torch
from engine_driver import DriverJob, assert_matches, drive, hf_greedy

from worker_svc.loader import EngineConfig, load_engine

SMALL = {"vocab_size": 200, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 1, "max_position_embeddings": 512,
         "eos_token_id": None, "bos_token_id": None, "pad_token_id": None}


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    return Qwen2ForCausalLM(Qwen2Config(**SMALL, tie_word_embeddings=True))


def _mistral():
    from transformers import MistralConfig, MistralForCausalLM

    return MistralForCausalLM(MistralConfig(**SMALL, sliding_window=24))


def _llama3_rope():
    from transformers import LlamaConfig, LlamaForCausalLM

    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
               "high_freq_factor": 4.0, "original_max_position_embeddings": 64}
    return LlamaForCausalLM(LlamaConfig(**SMALL, rope_scaling=scaling, rope_theta=500000.0))


@pytest.mark.parametrize("make", [_qwen2, _mistral, _llama3_rope],
                         ids=["qwen2", "mistral", "llama3"])
def test_variant_matches_transformers(make, tmp_path):
    torch.manual_seed(0)
    model = make().eval()
    model.save_pretrained(tmp_path)
    engine = load_engine(EngineConfig(model=str(tmp_path), num_blocks=128, block_size=8)).engine
    rng = random.Random(0)
    prompts = [[rng.randrange(200) for _ in range(n)] for n in (1, 9, 30, 70, 150)]
    refs = [hf_greedy(model, p, 20) for p in prompts]
    jobs = [DriverJob(i, p, 20, arrival=i) for i, p in enumerate(prompts)]
    out = drive(engine, jobs, chunk=16)
    for i, ref in enumerate(refs):
        assert_matches(out[i], ref, f"{make.__name__} prompt {i}")
