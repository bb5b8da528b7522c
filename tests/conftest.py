"""Repository-wide fixtures. pytest puts this directory on sys.path, so shared helpers
(``procs``) import as top-level modules from any test file.

``default_model_dir``: SmolLM2-135M-Instruct, pulled and converted once (cached).
``tiny_tok_model``: a random-weight 2-layer Llama with SmolLM2's vocabulary and tokenizer
files, for service tests where the text does not matter and speed does.
``gqa_model``: the same with 8 query heads over 4 KV heads, for tensor-parallel groups.
"""

from __future__ import annotations

import shutil

import pytest
import torch


@pytest.fixture(scope="session")
def default_model_dir():
    from fastserve.models import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL)


def _random_llama(tokenizer_dir, path, seed, **shape):
    """A random-weight Llama of ``shape`` with the tokenizer files (and vocabulary) of
    ``tokenizer_dir``, saved to ``path``."""
    from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

    src = AutoConfig.from_pretrained(tokenizer_dir)
    torch.manual_seed(seed)
    cfg = LlamaConfig(vocab_size=src.vocab_size, tie_word_embeddings=True,
                      eos_token_id=src.eos_token_id, bos_token_id=src.bos_token_id, **shape)
    LlamaForCausalLM(cfg).save_pretrained(path)
    for f in tokenizer_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="session")
def tiny_tok_model(default_model_dir, tmp_path_factory):
    return _random_llama(default_model_dir, tmp_path_factory.mktemp("tiny-tok"), 0,
                         hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1,
                         max_position_embeddings=2048)


@pytest.fixture(scope="session")
def gqa_model(default_model_dir, tmp_path_factory):
    """A random-weight Llama with 8 query heads over 4 KV heads (4 layers: up to 4 pipeline
    stages) and SmolLM2's tokenizer."""
    return _random_llama(default_model_dir, tmp_path_factory.mktemp("gqa"), 1,
                         hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                         num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=1024)
