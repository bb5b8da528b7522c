"""A rank's weights read slice by slice from safetensors files are exactly what slicing the
whole transformers model gives, for every tensor rank and pipeline stage."""

from __future__ import annotations

import pytest
import torch

from worker_svc.checkpoint import read_rank_weights, safetensors_files
from worker_svc.model.config import ModelSpec
from worker_svc.parallel.shard import shard_weights, stage_layers, stage_weights


def _save(path, tie: bool, dtype=torch.float32, **save):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(3)
    cfg = LlamaConfig(vocab_size=300, hidden_size=64, intermediate_size=128,
                      num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                      tie_word_embeddings=tie, attention_bias=True, mlp_bias=True,
                      max_position_embeddings=256)
    LlamaForCausalLM(cfg).to(dtype).save_pretrained(path, **save)
    return path


def _whole(path, dtype=torch.float32):
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    return ModelSpec.from_hf_config(hf.config), hf.state_dict()


@pytest.mark.parametrize("tie", [True, False])
def test_every_rank_and_stage_reads_what_slicing_the_whole_model_gives(tmp_path, tie):
    path = _save(tmp_path, tie)
    spec, state = _whole(path)
    for size, stages in [(1, 1), (2, 1), (1, 2), (2, 2), (1, 4)]:
        for stage in range(stages):
            layers = stage_layers(spec.num_layers, stages, stage)
            for rank in range(size):
                want = shard_weights(stage_weights(state, spec, layers), spec, rank, size)
                got = read_rank_weights(path, spec, layers, rank, size, torch.float32,
                                        torch.device("cpu"))
                # A tied LM head is not in the file (the embeddings serve as it).
                if tie:
                    want.pop("lm_head.weight", None)
                assert set(got) == set(want), (size, stages, stage, rank)
                for name, w in want.items():
                    assert torch.equal(got[name], w), name
                    assert got[name].is_contiguous()
                if size > 1:  # a row-parallel bias is added once
                    assert (f"model.layers.{layers.start}.mlp.down_proj.bias" in got) == (
                        rank == 0)


def test_a_sharded_bfloat16_checkpoint_reads_as_float32_like_transformers(tmp_path):
    path = _save(tmp_path, False, torch.bfloat16, max_shard_size="100KB")
    assert (path / "model.safetensors.index.json").is_file()
    assert len(safetensors_files(path)) > 1
    spec, state = _whole(path, torch.float32)
    got = read_rank_weights(path, spec, range(4), 0, 1, torch.float32, torch.device("cpu"))
    assert set(got) == set(state)
    for name, w in state.items():
        assert got[name].dtype == torch.float32 and torch.equal(got[name], w), name


def test_a_checkpoint_without_safetensors_is_left_to_transformers(tmp_path):
    path = _save(tmp_path, True, safe_serialization=False)
    spec, _ = _whole(path)
    assert safetensors_files(path) == []
    assert read_rank_weights(path, spec, range(4), 0, 1, torch.float32,
                             torch.device("cpu")) is None
    assert safetensors_files(tmp_path / "missing") == []


def test_the_engine_generates_the_same_from_either_format(tmp_path):
    """The loader's two ways in (safetensors read by rank, a .bin through transformers) give
    one model: the same greedy tokens."""
    from engine_driver import DriverJob, drive

    from worker_svc.loader import EngineConfig, load_engine

    outs = []
    for safe in (True, False):
        path = _save(tmp_path / str(safe), False, safe_serialization=safe)
        engine = load_engine(EngineConfig(model=str(path), num_blocks=64, block_size=16,
                                          predictor="none")).engine
        jobs = [DriverJob(i, [5 + i * 7 + k for k in range(9 + 4 * i)], 12) for i in range(3)]
        outs.append(drive(engine, jobs))
    assert outs[0] == outs[1] and all(len(v) == 12 for v in outs[0].values())
