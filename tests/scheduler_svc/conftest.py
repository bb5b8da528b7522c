"""Clusters of real processes for the scheduler's end-to-end tests.

``smol_cluster``: a worker with the default model (SmolLM2-135M) and an FCFS scheduler.
``tiny_tok_model``: a random-weight 2-layer Llama that uses SmolLM2's tokenizer and vocabulary,
for behaviour tests where the text does not matter and speed does.
"""

from __future__ import annotations

import shutil

import grpc
import pytest
import torch
from procs import start_scheduler, start_worker

from fastserve.proto import scheduler_pb2_grpc


class Cluster:
    def __init__(self, worker, scheduler):
        self.worker = worker
        self.scheduler = scheduler
        self.channel = grpc.insecure_channel(scheduler.address)
        self.stub = scheduler_pb2_grpc.SchedulerStub(self.channel)

    def close(self):
        self.channel.close()
        self.scheduler.stop()
        self.worker.stop()


@pytest.fixture(scope="session")
def default_model_dir():
    from fastserve.models import DEFAULT_MODEL, resolve_model

    return resolve_model(DEFAULT_MODEL)


@pytest.fixture(scope="session")
def tiny_tok_model(default_model_dir, tmp_path_factory):
    from transformers import AutoConfig, LlamaConfig, LlamaForCausalLM

    src = AutoConfig.from_pretrained(default_model_dir)
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=src.vocab_size, hidden_size=32, intermediate_size=64,
                      num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
                      max_position_embeddings=2048, tie_word_embeddings=True,
                      eos_token_id=src.eos_token_id, bos_token_id=src.bos_token_id)
    path = tmp_path_factory.mktemp("tiny-tok")
    LlamaForCausalLM(cfg).save_pretrained(path)
    for f in default_model_dir.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "vocab", "merges")):
            shutil.copy(f, path / f.name)
    return path


@pytest.fixture(scope="module")
def smol_cluster(default_model_dir, tmp_path_factory):
    logs = tmp_path_factory.mktemp("smol-cluster")
    worker = start_worker(str(default_model_dir), logs, 1024)
    try:
        scheduler = start_scheduler(str(default_model_dir), [worker.address], logs)
    except Exception:
        worker.stop()
        raise
    cluster = Cluster(worker, scheduler)
    yield cluster
    cluster.close()


@pytest.fixture()
def tiny_cluster(tiny_tok_model, tmp_path):
    """A fresh cluster per test: tests here kill and overload it."""
    worker = start_worker(str(tiny_tok_model), tmp_path, 256)
    try:
        scheduler = start_scheduler(str(tiny_tok_model), [worker.address], tmp_path,
                                    "--max-waiting", "4", "--max-batch-size", "4")
    except Exception:
        worker.stop()
        raise
    cluster = Cluster(worker, scheduler)
    yield cluster
    cluster.close()
