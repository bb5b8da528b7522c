"""The scheduling core driven with hand-built worker results (no worker, no gRPC)."""

from __future__ import annotations

import pytest
from core_driver import EOS, make_core, make_job, run_step

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import StepResult, TokenResult
from scheduler_svc.core.job import JobStatus


def test_fcfs_runs_everyone_to_max_tokens_and_frees_all_blocks():
    core = make_core()
    for i in range(5):
        core.add(make_job(i, prompt_len=3 + i, max_tokens=3 + i), 0.0)
    finished, t = [], 0.0
    while core.has_work():
        _, updates = run_step(core, t)
        finished += [u.job for u in updates if u.finished]
        t += 1
    assert sorted(j.job_id for j in finished) == list(range(5))
    assert all(j.status == JobStatus.FINISHED_LENGTH and len(j.output) == j.max_tokens
               for j in finished)
    assert core.kv.allocator.num_free == 64 and not core.jobs


def test_new_jobs_sent_once_then_only_diffs():
    core = make_core(block_size=4)
    core.add(make_job(1, prompt_len=6, max_tokens=10), 0.0)
    plan, _ = run_step(core, 0.0)
    assert [n.job_id for n in plan.new_jobs] == [1] and plan.new_jobs[0].block_ids == [0, 1]
    assert plan.commands[0].num_tokens == 6 and plan.commands[0].append_block_ids == []
    plan, _ = run_step(core, 1.0)  # token 7 computed: 7 tokens, still 2 blocks
    assert not plan.new_jobs and plan.commands[0].num_tokens == 1
    plan, _ = run_step(core, 2.0)  # 8 tokens
    plan, _ = run_step(core, 3.0)  # the 9th token needs a third block
    assert plan.commands[0].append_block_ids == [2]


def test_eos_stops_unless_ignored():
    core = make_core()
    core.add(make_job(1, max_tokens=10), 0.0)
    core.add(make_job(2, max_tokens=3, ignore_eos=True), 0.0)
    _, updates = run_step(core, 0.0, tokens={1: EOS, 2: EOS})
    done = {u.job.job_id: u.job for u in updates if u.finished}
    assert list(done) == [1] and done[1].status == JobStatus.FINISHED_STOPPED
    plan, _ = run_step(core, 1.0, tokens={2: EOS})
    assert plan.free_job_ids == [1]


def test_long_prompt_is_chunked_by_token_budget():
    core = make_core(max_batched_tokens=8)
    core.add(make_job(1, prompt_len=20), 0.0)
    core.add(make_job(2, prompt_len=3), 0.0)
    plan, updates = run_step(core, 0.0)
    assert [(c.job_id, c.num_tokens) for c in plan.commands] == [(1, 8)]
    assert updates == []
    plan, _ = run_step(core, 1.0)
    assert [(c.job_id, c.num_tokens) for c in plan.commands] == [(1, 8)]
    plan, updates = run_step(core, 2.0)
    assert [(c.job_id, c.num_tokens) for c in plan.commands] == [(1, 4), (2, 3)]
    assert {u.job.job_id for u in updates} == {1, 2}


def test_job_that_does_not_fit_waits_without_blocking_the_next():
    core = make_core(num_blocks=4, block_size=4, watermark=0.0)
    core.add(make_job(1, prompt_len=12, max_tokens=1), 0.0)  # 3 blocks
    run_step(core, 0.0)
    core.add(make_job(2, prompt_len=4, max_tokens=8), 0.0)
    core.add(make_job(3, prompt_len=3, max_tokens=1), 0.0)
    # After job 1 finishes: 4 blocks free. Both fit; everything runs.
    plan, _ = run_step(core, 1.0)
    assert {c.job_id for c in plan.commands} == {2, 3}


def test_started_job_preempts_lower_priority_by_recompute():
    core = make_core(num_blocks=4, block_size=4, watermark=0.0)
    core.add(make_job(1, prompt_len=4, max_tokens=12), 0.0)  # grows to 16 tokens = 4 blocks
    core.add(make_job(2, prompt_len=4, max_tokens=12), 0.0)
    t = 0.0
    preempted_seen = False
    while core.has_work():
        plan, _ = run_step(core, t)
        if plan and any(n.job_id == 2 and n.output for n in plan.new_jobs):
            preempted_seen = True  # job 2 re-sent with its generated tokens
        t += 1
        assert t < 200
    assert core.kv.num_recomputes >= 1 and preempted_seen
    assert core.kv.allocator.num_free == 4


def test_cancel_frees_blocks_and_tells_the_worker():
    core = make_core()
    core.add(make_job(1, max_tokens=50), 0.0)
    run_step(core, 0.0)
    assert core.kv.allocator.num_used == 2
    job = core.cancel(1, 1.0)
    assert job.status == JobStatus.CANCELLED and core.kv.allocator.num_used == 0
    plan = core.schedule(2.0)
    assert plan.free_job_ids == [1] and not plan.commands
    assert core.schedule(3.0) is None


def test_worker_error_fails_only_that_job():
    core = make_core()
    core.add(make_job(1), 0.0)
    core.add(make_job(2), 0.0)
    plan = core.schedule(0.0)
    res = StepResult([TokenResult(2, 5, 7, -0.1)], [(1, "block id 99 out of range")], 0.01)
    updates = core.update(plan.step_id, res, 0.1)
    by_id = {u.job.job_id: u.job for u in updates}
    assert by_id[1].status == JobStatus.FAILED and "out of range" in by_id[1].error
    assert by_id[2].output == [7] and not by_id[2].status.finished


def test_rtc_keeps_the_batch_fixed_until_all_end():
    core = make_core(policy="rtc", max_batch_size=2)
    core.add(make_job(1, max_tokens=1), 0.0)
    core.add(make_job(2, max_tokens=4), 0.0)
    core.add(make_job(3, max_tokens=1), 0.0)
    ran = []
    t = 0.0
    while core.has_work():
        plan, _ = run_step(core, t)
        ran.append(sorted(c.job_id for c in plan.commands))
        t += 1
    assert ran[0] == [1, 2] and ran[1] == [2] and ran[3] == [2] and ran[4] == [3]


def test_waiting_queue_bound():
    core = make_core(max_waiting=2)
    core.add(make_job(1), 0.0)
    assert core.can_admit()
    core.add(make_job(2), 0.0)
    assert not core.can_admit()


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="max_batch_size must be >= 1, got 0"):
        SchedulerConfig(max_batch_size=0)
    with pytest.raises(ValueError, match="policy must be one of"):
        make_core(policy="nope")


def test_a_detached_job_leaves_with_its_output_and_finishes_on_another_group():
    first, second = make_core(), make_core()
    first.add(make_job(1, prompt_len=6, max_tokens=5), 0.0)
    for t in range(2):
        run_step(first, float(t))
    job = first.jobs[1]
    assert job.kv.blocks and job.kv.on_worker and len(job.output) == 2
    first.detach(job)
    assert not first.jobs and first.kv.num_free == 64
    assert not job.kv.blocks and job.kv.num_computed == 0 and not job.kv.on_worker
    plan, _ = run_step(first, 2.0)  # the old group's worker is told to free it
    assert plan is not None and plan.free_job_ids == [1]
    second.add(job, 2.0)
    t = 3.0
    while second.has_work():
        run_step(second, t)
        t += 1
    assert job.status == JobStatus.FINISHED_LENGTH and len(job.output) == 5
    assert second.kv.num_free == 64
