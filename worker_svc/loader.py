"""Build an Engine from a model argument: weights loaded through transformers."""

from __future__ import annotations

import logging
import os
import pathlib
from dataclasses import dataclass, field

import torch

from fastserve.tls import Tls
from worker_svc.checkpoint import read_rank_weights
from worker_svc.engine import Engine
from worker_svc.kv_pool import KVPool, KVPoolConfig
from worker_svc.loops import LOOP_NGRAM
from worker_svc.model.config import ModelSpec, rope_tables
from worker_svc.model.linear import KERNELS
from worker_svc.model.llama import LlamaModel
from worker_svc.parallel.group import GroupLayout, TensorGroup
from worker_svc.parallel.shard import (
    check_pipeline_parallel,
    check_tensor_parallel,
    shard_spec,
    shard_weights,
    stage_layers,
    stage_weights,
)
from worker_svc.predictor import LengthPredictor, find_artifact
from worker_svc.swap import SwapEngine

log = logging.getLogger(__name__)

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class EngineConfig:
    model: str
    device: str = "cpu"
    dtype: str = "float32"
    num_blocks: int = 2048
    block_size: int = 16
    max_context: int | None = None
    # The node's KV store, HOST:PORT; None = no offloading (swaps fail UNAVAILABLE).
    kvstore: str | None = None
    # How this worker names itself to the store (its slots are accounted under this id).
    kvstore_client_id: str = "worker"
    kvstore_tls: Tls | None = None  # this worker's certificate for the store (mutual TLS)
    # CPU matmul kernel of the linears: "auto" times blas and onednn at load (linear.py).
    linear_kernel: str = "auto"
    # Output-length predictor: "auto" (this model's cached artifact, if trained), "none", or
    # an artifact path (which must exist).
    predictor: str = "auto"
    # Repeated tokens after which the predictor calls an answer a loop that runs to its cap
    # (``worker_svc.loops``); 0: never.
    loop_ngram: int = LOOP_NGRAM
    # This process's place in a tensor-parallel group (one rank of one by default).
    group: GroupLayout = field(default_factory=GroupLayout)
    # PyTorch's intra-op threads on this process (None: PyTorch's default, one per core).
    threads: int | None = None

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype must be one of {sorted(DTYPES)}, got {self.dtype!r}")
        if self.linear_kernel not in KERNELS:
            raise ValueError(f"linear_kernel must be one of {', '.join(KERNELS)}, got "
                             f"{self.linear_kernel!r}")
        torch.device(self.device)  # raises on a malformed device string
        if self.device.startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"device {self.device!r} requested but CUDA is not available")
        if self.num_blocks < 1 or self.block_size < 1:
            raise ValueError(
                f"num_blocks and block_size must be >= 1, got {self.num_blocks}, {self.block_size}"
            )
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")
        if self.loop_ngram < 0:
            raise ValueError(f"loop_ngram must be >= 0 (0: no loop check), got "
                             f"{self.loop_ngram}")


@dataclass
class LoadedModel:
    engine: Engine
    spec: ModelSpec  # the whole model's (the engine's model holds this rank's shard)
    hf_config: object
    model_path: str
    predictor: str = ""  # what predicts output lengths (Describe), empty when nothing does
    group: GroupLayout = field(default_factory=GroupLayout)


def load_predictor(cfg: EngineConfig, model_path: str, spec: ModelSpec,
                   device: torch.device) -> tuple[LengthPredictor | None, str]:
    """The predictor ``cfg.predictor`` names and its description, or (None, "")."""
    if cfg.predictor == "none":
        return None, ""
    if cfg.predictor == "auto":
        found = find_artifact(model_path)
        if found is None:
            log.info("no output-length predictor for this model (fastserve predictor train)")
            return None, ""
        path = found
    else:
        path = pathlib.Path(cfg.predictor)
        if not path.is_file():
            raise ValueError(f"predictor: {path} does not exist")
    try:
        predictor = LengthPredictor.load(path, spec.hidden_size, spec.num_layers, device,
                                         cfg.loop_ngram)
    except (ValueError, KeyError, RuntimeError) as e:
        raise ValueError(f"predictor {path}: {e}") from e
    held = predictor.info.get("held_out", {}).get("first_token", {})
    desc = f"{path.name} (layer {predictor.layer}"
    if held:
        desc += (f"; held-out MAE {held['mae_tokens']:.0f} tokens, Spearman "
                 f"{held['spearman']:.2f}")
    if cfg.loop_ngram:
        desc += f"; a loop after {cfg.loop_ngram} repeated tokens"
    log.info("output-length predictor %s", desc + ")")
    return predictor, desc + ")"


def _rank_weights(path: str, spec: ModelSpec, layers: range, layout: GroupLayout,
                  dtype: torch.dtype, device: torch.device) -> dict[str, torch.Tensor]:
    """This rank's weights: read slice by slice from the checkpoint's safetensors files (no
    rank holds the whole model on the way), or through transformers for other formats."""
    weights = read_rank_weights(path, spec, layers, layout.rank, layout.size, dtype, device)
    if weights is not None:
        return weights
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
    mine = stage_weights(hf.state_dict(), spec, layers)
    return shard_weights({k: v.detach().to(device) for k, v in mine.items()}, spec,
                         layout.rank, layout.size)


def load_engine(cfg: EngineConfig) -> LoadedModel:
    """Load the model (this rank's shard of it, in a group) and its KV pool; in a group,
    returns once every rank has joined."""
    from transformers import AutoConfig, GenerationConfig

    from fastserve.models import resolve_model

    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    # Weights and the KV pool in 2 MB pages on the CPU (PyTorch's allocator madvises
    # allocations of 2 MB and more when this is set before its first one): a decode reads
    # every weight and each job's scattered KV blocks once per iteration, and with 4 KB pages
    # the TLB misses cost 2-3% of a batch-8 decode here. THP_MEM_ALLOC_ENABLE=0 turns it off.
    os.environ.setdefault("THP_MEM_ALLOC_ENABLE", "1")
    path = str(resolve_model(cfg.model))
    dtype = DTYPES[cfg.dtype]
    device = torch.device(cfg.device)
    layout = cfg.group
    where = layout.describe()
    log.info("loading %s (%s on %s%s)", path, cfg.dtype, device, f", {where}" if where else "")
    hf_config = AutoConfig.from_pretrained(path)
    try:
        gen_cfg = GenerationConfig.from_pretrained(path)
    except OSError:
        gen_cfg = None
    full = ModelSpec.from_hf_config(hf_config, gen_cfg)
    # Said at start-up, naming the heads or the layers.
    check_tensor_parallel(full, layout.size)
    check_pipeline_parallel(full, layout.num_stages)
    layers = stage_layers(full.num_layers, layout.num_stages, layout.stage)
    spec = shard_spec(full, layout.size)
    weights = _rank_weights(path, full, layers, layout, dtype, device)
    max_positions = min(cfg.max_context or spec.max_position_embeddings,
                        spec.max_position_embeddings)
    cos, sin = rope_tables(hf_config, max_positions, device)
    model = LlamaModel(spec, weights, cos, sin, linear_kernel=cfg.linear_kernel, layers=layers)
    model.computes_logits = layout.samples  # only one rank samples
    log.info("layers [%d, %d) of %d; linears on the %s kernel", layers.start, layers.stop,
             full.num_layers, model.linear_kernel)
    del weights
    pool = KVPool(
        KVPoolConfig(len(layers), spec.num_kv_heads, spec.head_dim, cfg.num_blocks,
                     cfg.block_size),
        device,
        dtype,
    )
    # Each rank stores its own heads' and layers' part of a block under its own lease.
    client_id = (f"{cfg.kvstore_client_id}/rank{layout.global_rank}" if layout.parallel
                 else cfg.kvstore_client_id)
    swap = SwapEngine(pool, cfg.kvstore, client_id=client_id, tls=cfg.kvstore_tls)
    # The predictor reads one layer's residual stream: it runs on the stage holding that
    # layer; the group's rank 0 describes it.
    predictor, described = (load_predictor(cfg, path, full, device)
                            if layout.rank == 0 and (layout.leader or layout.pipelined)
                            else (None, ""))
    if predictor is not None and not set(predictor.layers) <= set(layers):
        predictor = None
    if not layout.leader:
        described = ""
    # Joined last, once everything slow here is done: from now on rank 0's commands (and
    # heartbeats) come within seconds.
    group = TensorGroup(layout, device) if layout.parallel else None
    if group is not None and layout.size > 1:
        model.use_group(group.all_reduce)
    engine = Engine(model, pool, max_positions, swap, predictor, group)
    if layout.pipelined and layout.leader:
        from worker_svc.parallel.pipeline import PipelineLeader

        engine.pipeline = PipelineLeader(engine)
    return LoadedModel(engine, full, hf_config, path, described, layout)
