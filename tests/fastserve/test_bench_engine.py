"""End-to-end test of `fastserve bench engine` on a tiny random Llama (no download)."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> pathlib.Path:
    path = tmp_path_factory.mktemp("tiny-llama")
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
        tie_word_embeddings=False, eos_token_id=None, bos_token_id=None, pad_token_id=None,
    )
    transformers.LlamaForCausalLM(cfg).save_pretrained(path)
    return path


def test_bench_engine_tiny_model(tiny_model, tmp_path):
    out = tmp_path / "out.json"
    cmd = [sys.executable, "-m", "fastserve.cli", "bench", "engine", "--model", str(tiny_model),
           "--batch-sizes", "1,4", "--decode-tokens", "4", "--prompt-len", "16",
           "--prefill-len", "32", "--prefill-batch", "2", "--json", str(out)]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]

    doc = json.loads(out.read_text())
    for system in ("engine", "transformers"):
        figures = doc[system]
        assert set(figures) >= {"decode_tokens_s", "prefill_tokens_s"}
        assert set(figures["decode_tokens_s"]) == {"1", "4"}
        for value in [*figures["decode_tokens_s"].values(), figures["prefill_tokens_s"]]:
            assert isinstance(value, float) and value > 0
    config = doc["config"]
    assert config["model"] == str(tiny_model)
    assert config["device"] == "cpu" and config["dtype"] == "float32"
    assert config["threads"] >= 1 and config["torch"] == torch.__version__
    assert config["prompt_len"] == 16 and config["prefill_len"] == 32

    # the table goes to stdout, progress to stderr
    assert "decode tok/s  batch 4" in proc.stdout and "prefill tok/s (32 x 2)" in proc.stdout
    match = re.search(r"greedy token mismatches: (\d+) of (\d+) rows", proc.stdout)
    assert match, proc.stdout
    assert int(match.group(1)) == 0, proc.stdout
    assert int(match.group(2)) == 1 + 4 + 2
    assert "%" in proc.stderr  # tqdm bar
