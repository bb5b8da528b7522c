"""Small factories for driving a GroupCore with hand-built worker results."""

from __future__ import annotations

import math

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.contract import StepResult, TokenResult
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.group import GroupCore
from scheduler_svc.core.job import Job

EOS = 2
BS = 4


def make_core(num_blocks=64, block_size=4, max_context=256, cost_model=None,
              **overrides) -> GroupCore:
    return GroupCore(SchedulerConfig(**overrides), num_blocks, block_size, max_context,
                         cost_model=cost_model)


def make_job(job_id, prompt_len=5, max_tokens=4, now=0.0, **kw) -> Job:
    return Job(job_id, list(range(10, 10 + prompt_len)), max_tokens, now,
               eos_token_ids=frozenset({EOS}), **kw)


def count_walked(core) -> list[int]:
    """Count the jobs ``core``'s policy order yields from now on: the returned one-element
    list holds the running total (a walk that stops early reads few of them)."""
    seen = [0]
    real_order = core.policy.order

    def counting(now):
        for job in real_order(now):
            seen[0] += 1
            yield job

    core.policy.order = counting
    return seen


def run_step(core, now, tokens=None, elapsed=0.01):
    """Schedule, then answer like a worker: token 7 (or tokens[job_id]) for jobs that sample."""
    plan = core.schedule(now)
    if plan is None:
        return None, []
    results = []
    for cmd in plan.commands:
        job = core.jobs.get(cmd.job_id)
        done = cmd.num_computed
        tok = (tokens or {}).get(cmd.job_id, 7) if done == job.num_tokens else None
        results.append(TokenResult(cmd.job_id, done, tok, -0.5 if tok is not None else None))
    updates = core.update(plan.step_id, StepResult(results, [], elapsed), now + elapsed)
    core.check_invariants()
    return plan, updates


# Decode 10 ms at batch 1; prefill 10 ms + 1 ms per token.
LINEAR = CostModel(decode=((1, 0.010), (64, 0.020)), prefill=((1, 0.010), (1001, 1.010)))


def iteration_cost(core, plan) -> float:
    """What LINEAR says ``plan`` costs: the simulated worker's clock."""
    decodes = sum(1 for c in plan.commands if c.num_tokens == 1)
    prefill = sum(c.num_tokens for c in plan.commands if c.num_tokens > 1)
    return core.cost_model.iteration_time(decodes, prefill)


class WorkerModel:
    """What a worker would hold after each Step; asserts the plan is valid for it: swaps only
    of jobs in the right place, swap-ins into free blocks of exactly the job's computed KV, no
    command for an offloaded job, no block owned twice, every command's count as planned."""

    def __init__(self, num_blocks: int):
        self.owner: dict[int, int] = {}
        self.computed: dict[int, int] = {}
        self.offloaded: set[int] = set()
        self.num_blocks = num_blocks

    @staticmethod
    def token(job_id: int, position: int) -> int:
        """The token a job samples after ``position`` tokens: 7, never EOS."""
        return 7

    def _claim(self, jid: int, blocks: list[int]) -> None:
        for b in blocks:
            assert 0 <= b < self.num_blocks
            assert b not in self.owner, f"block {b} of job {self.owner.get(b)} given to {jid}"
            self.owner[b] = jid

    def _release(self, jid: int) -> None:
        self.owner = {b: j for b, j in self.owner.items() if j != jid}

    def apply(self, plan, core: GroupCore | None = None) -> list[TokenResult]:
        for jid in plan.free_job_ids:
            assert jid in self.computed, f"free of unknown job {jid}"
            self._release(jid)
            del self.computed[jid]
            self.offloaded.discard(jid)
        for jid in plan.swap_out:
            assert jid in self.computed and jid not in self.offloaded
            held = [b for b, j in self.owner.items() if j == jid]
            assert len(held) == math.ceil(self.computed[jid] / BS) > 0
            self._release(jid)
            self.offloaded.add(jid)
        for sw in plan.swap_in:
            assert sw.job_id in self.offloaded, f"swap-in of job {sw.job_id} not offloaded"
            assert len(sw.block_ids) == math.ceil(self.computed[sw.job_id] / BS)
            self._claim(sw.job_id, sw.block_ids)
            self.offloaded.discard(sw.job_id)
        for n in plan.new_jobs:
            assert n.job_id not in self.computed
            self.computed[n.job_id] = 0
            self._claim(n.job_id, n.block_ids)
        results = []
        for cmd in plan.commands:
            assert cmd.job_id not in self.offloaded, f"command for offloaded job {cmd.job_id}"
            self._claim(cmd.job_id, cmd.append_block_ids)
            done = self.computed[cmd.job_id] + cmd.num_tokens
            held = sum(1 for j in self.owner.values() if j == cmd.job_id)
            assert held * BS >= done, f"job {cmd.job_id}: {done} tokens in {held} blocks"
            assert done == cmd.num_computed, f"job {cmd.job_id}: planned {cmd.num_computed}"
            self.computed[cmd.job_id] = done
            results.append(TokenResult(cmd.job_id, done, self.token(cmd.job_id, done)
                                       if cmd.samples else None))
        return results
