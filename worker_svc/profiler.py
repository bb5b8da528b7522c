"""Self-profiling: how long this worker's iterations take, for the scheduler's cost model.

Timings are measured with the engine itself (the compute time it reports for a Step), on jobs
with ids from a reserved range that are freed afterwards, and cached as JSON under
``cache_dir()/profiles/<key>.json``; the key hashes everything the timings depend on, so a
restart with the same settings reuses them.

| curve   | points                                  | each point                            |
|---------|-----------------------------------------|---------------------------------------|
| decode  | batch 1, 2, 4, ..., 32 (free blocks)    | one token per job at context ~128 (*) |
| prefill | 16, 32, ..., 1024 tokens (max context)  | one job's whole prompt in one Step    |

(*) or what the pool holds, if less.

Each curve is warmed up once; each point is the median of ``REPEATS`` iterations.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
import os
import random
import statistics
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from worker_svc.engine import Engine, JobCommand, NewJob, StepCommand, StepOutcome

log = logging.getLogger(__name__)

DECODE_BATCH_SIZES = (1, 2, 4, 8, 16, 32)
DECODE_CONTEXT = 128
PREFILL_TOKENS = (16, 32, 64, 128, 256, 512, 1024)
REPEATS = 3
# Scheduler job ids are arbitrary uint64s; profiling only runs with no live jobs, so ids at
# the top of the range cannot collide with anything.
JOB_ID_BASE = 2**64 - 2**16
FORMAT_VERSION = 1


@dataclass(frozen=True)
class DecodePoint:
    batch_size: int
    context_len: int
    time_s: float


@dataclass(frozen=True)
class PrefillPoint:
    num_tokens: int
    time_s: float


@dataclass
class Profile:
    """Measured iteration times; ``cached`` says it was read from disk, not measured now."""

    cache_key: str
    decode: list[DecodePoint] = field(default_factory=list)
    prefill: list[PrefillPoint] = field(default_factory=list)
    measured_at_unix_s: float = 0.0
    cached: bool = False


def cache_key(engine: Engine, model_path: str) -> str:
    """Hash of what the timings depend on: model, device (and GPU name), dtype, pool, torch."""
    device = engine.pool.device
    parts = {
        "format": FORMAT_VERSION,
        "model_path": str(Path(model_path).resolve()) if Path(model_path).exists() else model_path,
        "device": str(device),
        "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else "",
        "dtype": str(engine.pool.dtype).removeprefix("torch."),
        "num_blocks": engine.pool.num_blocks,
        "block_size": engine.pool.block_size,
        "max_context": engine.max_context,
        "torch": torch.__version__,
    }
    if engine.group is not None:  # one rank's share of the compute, plus the all-reduces
        parts["tensor_parallel"] = engine.group.size
        if engine.group.layout.pipelined:  # a Step's way through every stage
            parts["pipeline_parallel"] = engine.group.layout.num_stages
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:32]


def profile_path(key: str) -> Path:
    from fastserve.models import cache_dir

    return cache_dir() / "profiles" / f"{key}.json"


def get_profile(engine: Engine, model_path: str, force: bool = False) -> Profile:
    """The cached profile for these settings, or a fresh measurement (then cached).

    Measuring needs an idle engine (no live jobs) and the caller must keep others from
    stepping it meanwhile.
    """
    key = cache_key(engine, model_path)
    path = profile_path(key)
    if not force:
        cached = load(path)
        # One with no decode point came from a pool too small for the old fixed context
        # (the scheduler cannot start on it): measured again.
        if cached is not None and cached.decode:
            return cached
    profile = measure(engine, key)
    try:
        save(profile, path)
    except OSError as e:
        log.warning("could not cache the profile at %s: %s", path, e)
    return profile


def measure(engine: Engine, key: str) -> Profile:
    """Time decode and prefill iterations on ``engine``, which must have no live jobs."""
    if engine.jobs:
        raise RuntimeError(f"profiling needs an idle engine; {len(engine.jobs)} jobs are live")
    start = time.perf_counter()
    try:
        profile = Profile(key, _measure_decode(engine), _measure_prefill(engine), time.time())
    finally:
        leftover = [j for j in engine.jobs if j >= JOB_ID_BASE]
        if leftover:
            engine.step(StepCommand(free_job_ids=leftover))
    log.info(
        "profiled in %.1f s: decode %s; prefill %s",
        time.perf_counter() - start,
        [(p.batch_size, round(p.time_s, 5)) for p in profile.decode],
        [(p.num_tokens, round(p.time_s, 5)) for p in profile.prefill],
    )
    return profile


def load(path: Path) -> Profile | None:
    """The profile stored at ``path``, or None if there is none or it is unreadable."""
    try:
        data = json.loads(path.read_text())
        if data.get("format") != FORMAT_VERSION:
            return None
        return Profile(
            cache_key=data["cache_key"],
            decode=[DecodePoint(**p) for p in data["decode"]],
            prefill=[PrefillPoint(**p) for p in data["prefill"]],
            measured_at_unix_s=data["measured_at_unix_s"],
            cached=True,
        )
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("ignoring unreadable profile %s: %s", path, e)
        return None


def save(profile: Profile, path: Path) -> None:
    data = dataclasses.asdict(profile)
    data.pop("cached")
    data["format"] = FORMAT_VERSION
    path.parent.mkdir(parents=True, exist_ok=True)
    # Write then rename, so a concurrent reader never sees half a file.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


def _measure_decode(engine: Engine) -> list[DecodePoint]:
    pool = engine.pool
    # The jobs are prefilled once and shared by all batch sizes, so each grows by one token
    # per iteration it takes part in; room is reserved for all of them.
    num_iterations = 1 + REPEATS * len(DECODE_BATCH_SIZES)
    num_free = pool.num_blocks - pool.num_used_blocks
    # A pool too small for one job at DECODE_CONTEXT is profiled at the context it holds:
    # the scheduler needs at least one decode point to start.
    context = min(DECODE_CONTEXT, engine.max_context - 1 - num_iterations,
                  num_free * pool.block_size - num_iterations)
    if context < 1:
        return []
    blocks_per_job = math.ceil((context + num_iterations) / pool.block_size)
    sizes = [b for b in DECODE_BATCH_SIZES if b * blocks_per_job <= num_free]
    if not sizes:
        return []
    ids = [JOB_ID_BASE + i for i in range(sizes[-1])]
    rng = random.Random(0)
    new_jobs = [
        NewJob(
            j,
            _prompt(rng, engine.vocab_size, context),
            block_ids=list(range(i * blocks_per_job, (i + 1) * blocks_per_job)),
        )
        for i, j in enumerate(ids)
    ]
    _step(engine, StepCommand(new_jobs=new_jobs, commands=[JobCommand(j, context) for j in ids]))
    _step(engine, StepCommand(commands=[JobCommand(ids[0], 1)]))  # warm-up
    points = []
    for size in sizes:
        times, contexts = [], []
        for _ in range(REPEATS):
            out = _step(engine, StepCommand(commands=[JobCommand(j, 1) for j in ids[:size]]))
            times.append(out.compute_time_s)
            contexts.extend(r.num_computed_tokens for r in out.results)
        points.append(DecodePoint(size, round(statistics.mean(contexts)), statistics.median(times)))
    _step(engine, StepCommand(free_job_ids=ids))
    return points


def _measure_prefill(engine: Engine) -> list[PrefillPoint]:
    pool = engine.pool
    num_free = pool.num_blocks - pool.num_used_blocks
    sizes = [
        n
        for n in PREFILL_TOKENS
        if n < engine.max_context and math.ceil(n / pool.block_size) <= num_free
    ]
    rng = random.Random(1)
    job_id = JOB_ID_BASE

    def run_once(n: int) -> float:
        blocks = list(range(math.ceil(n / pool.block_size)))
        out = _step(
            engine,
            StepCommand(
                new_jobs=[NewJob(job_id, _prompt(rng, engine.vocab_size, n), block_ids=blocks)],
                commands=[JobCommand(job_id, n)],
            ),
        )
        _step(engine, StepCommand(free_job_ids=[job_id]))
        return out.compute_time_s

    if sizes:
        run_once(sizes[0])  # warm-up
    return [PrefillPoint(n, statistics.median(run_once(n) for _ in range(REPEATS))) for n in sizes]


def _prompt(rng: random.Random, vocab_size: int, n: int) -> list[int]:
    return [rng.randrange(vocab_size) for _ in range(n)]


def _step(engine: Engine, cmd: StepCommand) -> StepOutcome:
    out = engine.step(cmd)
    if out.errors:
        raise RuntimeError(f"profiling step failed: {out.errors[0].message}")
    return out
