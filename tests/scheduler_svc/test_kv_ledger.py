"""The KV ledger on its own: hypothesis-generated hold / swap / drop / confirm sequences keep
its invariants (no block held twice, free + held + outgoing = total, the store's count)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_svc.core.contract import StepPlan, StepResult
from scheduler_svc.core.job import Job
from scheduler_svc.core.kv.allocator import blocks_for
from scheduler_svc.core.kv.ledger import KVLedger

BS = 4
OPS = st.lists(st.tuples(st.sampled_from(["grow", "swap_out", "swap_in", "drop", "release",
                                          "settle", "settle_refused", "lose"]),
                         st.integers(0, 5), st.integers(1, 6)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(OPS, st.integers(4, 40), st.integers(0, 30))
def test_any_sequence_keeps_the_ledger_consistent(ops, num_blocks, store_blocks):
    ledger = KVLedger(num_blocks, BS, store_blocks)
    jobs = {i: Job(i, [1] * 3, 10, 0.0) for i in range(6)}
    plans: list[StepPlan] = []
    ledger.begin_step(0.0)
    plan = StepPlan()
    for op, jid, n in ops:
        job = jobs[jid]
        kv = job.kv
        busy = {j for p in plans for j in p.swap_out + [s.job_id for s in p.swap_in]}
        if jid in busy and op not in ("settle", "settle_refused"):
            continue
        if op in ("swap_out", "swap_in") and ledger.moved(job, plan):
            continue  # one move per job per Step, as the batcher and planner keep it
        if op == "grow" and not kv.stored and ledger.num_free >= n:
            ledger.grow(job, n)
            kv.on_worker = True
            kv.num_computed = len(kv.blocks) * BS
        elif op == "swap_out" and kv.blocks and ledger.swappable(job) \
                and len(kv.blocks) <= ledger.store_free():
            ledger.swap_out(job, plan)
        elif op == "swap_in" and kv.stored \
                and blocks_for(kv.num_computed, BS) <= ledger.num_free:
            ledger.swap_in(job, plan)
        elif op == "drop" and (kv.blocks or kv.stored):
            ledger.drop(job, plan)
        elif op == "release" and kv.blocks:
            ledger.release(job)
        elif op == "lose":
            ledger.lose(job)
        elif op.startswith("settle"):
            if plan.swap_out or plan.swap_in:
                plans.append(plan)
                plan = StepPlan()
            if plans:
                done = plans.pop(0)
                refused = done.swap_out if op == "settle_refused" else []
                ledger.settle(done, StepResult(swap_refused=refused), 1.0, jobs)
        ledger.check(jobs.values())
    plans.append(plan)
    for done in plans:
        ledger.settle(done, StepResult(), 2.0, jobs)
    ledger.check(jobs.values())
    for job in jobs.values():
        ledger.release(job)
        ledger.unstore(job)
    assert ledger.num_free == num_blocks and ledger.store_used == 0


def test_a_refused_swap_out_gives_the_blocks_back_and_pauses_swaps():
    ledger = KVLedger(8, BS, store_blocks=8)
    job = Job(1, [1] * 3, 10, 0.0)
    ledger.begin_step(0.0)
    ledger.grow(job, 2)
    job.kv.on_worker, job.kv.num_computed = True, 8
    plan = StepPlan()
    ledger.swap_out(job, plan)
    assert not job.kv.blocks and job.kv.stored == 2 and ledger.num_free == 6
    ledger.settle(plan, StepResult(swap_refused=[1]), 0.5, {1: job})
    assert len(job.kv.blocks) == 2 and not job.kv.stored and ledger.store_used == 0
    ledger.begin_step(1.0)
    assert not ledger.store_up  # refused: the store is full or gone for a second
    ledger.begin_step(1.6)
    assert ledger.store_up
    ledger.check([job])


def test_an_upload_is_ready_after_every_offload_of_its_step():
    """The worker copies a Step's offloads before its uploads, so an offload planned after an
    upload in the same Step delays that upload; the ledger's prediction must say so, or the
    batcher commands the job while its copy is still running and the iteration waits."""
    from scheduler_svc.core.cost_model import CostModel

    priced = CostModel(decode=((1, 0.01),), prefill=((1, 0.01),), kv_bytes_per_token=1000,
                       swap_bytes_per_s=1e6)  # 4 ms per block of 4 tokens
    ledger = KVLedger(16, BS, 64, priced)
    up, out = Job(0, [1] * 3, 10, 0.0), Job(1, [1] * 3, 10, 0.0)
    for job, n in ((up, 2), (out, 3)):
        ledger.grow(job, n)
        job.kv.on_worker, job.kv.num_computed = True, n * BS
    ledger.begin_step(0.0)
    plan = StepPlan()
    ledger.swap_out(up, plan)
    ledger.settle(plan, StepResult(), 0.008, {0: up, 1: out})
    ledger.begin_step(1.0)  # the copy engine is idle again
    plan = StepPlan()
    ledger.swap_in(up, plan)  # 2 blocks: 8 ms
    ledger.swap_out(out, plan)  # 3 blocks, copied first: 12 ms
    assert plan.swap_in[0].job_id == 0 and plan.swap_out == [1]
    assert ledger.upload_pending(up, 1.019)
    assert not ledger.upload_pending(up, 1.0201)
