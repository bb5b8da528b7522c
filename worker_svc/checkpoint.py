"""A rank's weights read straight from a checkpoint's safetensors files.

A worker group exists for models larger than one device, so no rank may need the whole model
in memory on its way to its shard: each rank opens the files (memory-mapped) and reads only the
tensors of its pipeline stage (``shard.stage_keeps``), and of those only its tensor-parallel
slice (``shard.shard_rule``: rows or columns straight from the file), converted to the serving
dtype. A checkpoint without safetensors files (``pytorch_model.bin``) returns None, and the
loader reads it through transformers as a whole.
"""

from __future__ import annotations

import json
import pathlib

import torch

from worker_svc.model.config import ModelSpec
from worker_svc.parallel.shard import shard_rule, stage_keeps

INDEX = "model.safetensors.index.json"


def safetensors_files(path: str | pathlib.Path) -> list[pathlib.Path]:
    """The checkpoint's safetensors files (by its index when it has one), or [] when the
    directory has none."""
    d = pathlib.Path(path)
    if not d.is_dir():
        return []
    index = d / INDEX
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        return [d / n for n in names]
    return sorted(d.glob("*.safetensors"))


def read_rank_weights(path: str | pathlib.Path, spec: ModelSpec, layers: range, rank: int,
                      size: int, dtype: torch.dtype,
                      device: torch.device) -> dict[str, torch.Tensor] | None:
    """This rank's tensors (stage ``layers``, tensor rank ``rank`` of ``size``) in ``dtype``
    on ``device``, or None when the checkpoint has no safetensors files."""
    from safetensors import safe_open

    files = safetensors_files(path)
    if not files:
        return None
    out: dict[str, torch.Tensor] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if not stage_keeps(name, spec, layers):
                    continue
                rule = shard_rule(name, spec, rank, size)
                if rule is None:
                    continue
                if rule is True:
                    t = f.get_tensor(name)
                else:
                    dim, start, stop = rule
                    part = f.get_slice(name)
                    t = part[start:stop] if dim == 0 else part[:, start:stop]
                out[name] = t.to(device=device, dtype=dtype).contiguous()
    return out
