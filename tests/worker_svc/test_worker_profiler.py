"""Self-profiling on a tiny random Llama, in process."""

from __future__ import annotations

import pathlib

import pytest

from worker_svc import profiler
from worker_svc.engine import NewJob, StepCommand
from worker_svc.loader import EngineConfig, LoadedModel, load_engine


def make_loaded(model_dir: pathlib.Path, **overrides) -> LoadedModel:
    cfg = {"model": str(model_dir), "num_blocks": 64, "block_size": 16, **overrides}
    return load_engine(EngineConfig(**cfg))


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch) -> pathlib.Path:
    monkeypatch.setenv("FASTSERVE_CACHE_DIR", str(tmp_path))
    return tmp_path


def test_points_are_capped_by_blocks_and_context_and_leave_nothing_behind(tiny_llama_dir):
    engine = make_loaded(tiny_llama_dir, num_blocks=40, max_context=200).engine
    p = profiler.measure(engine, "k")
    # Context 128 + 19 iterations = 10 blocks a job: 40 blocks hold 4 jobs.
    assert [d.batch_size for d in p.decode] == [1, 2, 4]
    assert [x.num_tokens for x in p.prefill] == [16, 32, 64, 128]  # < max_context 200
    assert all(x.time_s > 0 for x in [*p.decode, *p.prefill])
    assert engine.jobs == {} and engine.pool.num_used_blocks == 0


def test_a_pool_too_small_for_one_job_at_the_usual_context_is_profiled_at_a_shorter_one(
        tiny_llama_dir):
    # 4 blocks of 16 = 64 tokens: 19 iterations from a context of 45, not 128; the scheduler
    # cannot start without a decode point.
    engine = make_loaded(tiny_llama_dir, num_blocks=4).engine
    p = profiler.measure(engine, "k")
    # The prompt of 45, a warm-up token, then 3 timed decodes: contexts 47, 48, 49.
    assert [(d.batch_size, d.context_len) for d in p.decode] == [(1, 48)]
    assert [x.num_tokens for x in p.prefill] == [16, 32, 64]
    assert engine.jobs == {} and engine.pool.num_used_blocks == 0


def test_decode_is_skipped_when_not_even_a_short_job_fits(tiny_llama_dir):
    engine = make_loaded(tiny_llama_dir, num_blocks=1).engine
    p = profiler.measure(engine, "k")
    assert p.decode == [] and [x.num_tokens for x in p.prefill] == [16]


def test_measuring_needs_an_idle_engine(tiny_llama_dir):
    engine = make_loaded(tiny_llama_dir).engine
    engine.step(StepCommand(new_jobs=[NewJob(7, [1, 2], block_ids=[0])]))
    with pytest.raises(RuntimeError, match="1 jobs are live"):
        profiler.measure(engine, "k")
    assert list(engine.jobs) == [7]


def test_profile_is_cached_per_settings(tiny_llama_dir, cache):
    loaded = make_loaded(tiny_llama_dir)
    first = profiler.get_profile(loaded.engine, loaded.model_path)
    assert not first.cached
    path = cache / "profiles" / f"{first.cache_key}.json"
    assert path.is_file()

    again = profiler.get_profile(loaded.engine, loaded.model_path)
    assert again.cached and (again.decode, again.prefill) == (first.decode, first.prefill)
    forced = profiler.get_profile(loaded.engine, loaded.model_path, force=True)
    assert not forced.cached and forced.measured_at_unix_s > first.measured_at_unix_s

    other = make_loaded(tiny_llama_dir, num_blocks=65)
    assert profiler.cache_key(other.engine, other.model_path) != first.cache_key


def test_a_cached_profile_without_decode_points_is_measured_again(tiny_llama_dir, cache):
    loaded = make_loaded(tiny_llama_dir, num_blocks=4)
    first = profiler.get_profile(loaded.engine, loaded.model_path)
    path = cache / "profiles" / f"{first.cache_key}.json"
    profiler.save(profiler.Profile(first.cache_key, [], first.prefill, 1.0), path)
    again = profiler.get_profile(loaded.engine, loaded.model_path)
    assert not again.cached and again.decode


def test_unreadable_cache_file_is_ignored(cache):
    path = cache / "broken.json"
    path.write_text("{not json")
    assert profiler.load(path) is None
    assert profiler.load(cache / "missing.json") is None


def test_a_group_s_layout_is_part_of_its_profile_key(tiny_llama_dir):
    """A profile measured by one process is not taken for a group's, nor a tensor-parallel
    group's for a pipeline's: each Step costs differently."""
    from types import SimpleNamespace

    from worker_svc.parallel.group import GroupLayout

    engine = make_loaded(tiny_llama_dir).engine
    keys = {profiler.cache_key(engine, "m")}
    for size, stages in [(2, 1), (1, 2), (2, 2), (1, 3)]:
        layout = GroupLayout(0, size, "127.0.0.1:1", 30.0, 0, stages)
        engine.group = SimpleNamespace(size=size, layout=layout)
        keys.add(profiler.cache_key(engine, "m"))
    assert len(keys) == 5
