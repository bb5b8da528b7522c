"""Small factories for driving a SchedulerCore with hand-built worker results."""

from __future__ import annotations

from scheduler_svc.core.config import SchedulerConfig
from scheduler_svc.core.cost_model import CostModel
from scheduler_svc.core.job import Job
from scheduler_svc.core.scheduler import SchedulerCore, StepResult, TokenResult

EOS = 2


def make_core(num_blocks=64, block_size=4, max_context=256, cost_model=None,
              **overrides) -> SchedulerCore:
    return SchedulerCore(SchedulerConfig(**overrides), num_blocks, block_size, max_context,
                         cost_model=cost_model)


def make_job(job_id, prompt_len=5, max_tokens=4, now=0.0, **kw) -> Job:
    return Job(job_id, list(range(10, 10 + prompt_len)), max_tokens, now,
               eos_token_ids=frozenset({EOS}), **kw)


def run_step(core, now, tokens=None, elapsed=0.01):
    """Schedule, then answer like a worker: token 7 (or tokens[job_id]) for jobs that sample."""
    plan = core.schedule(now)
    if plan is None:
        return None, []
    results = []
    for cmd in plan.commands:
        job = core.jobs.get(cmd.job_id)
        done = job.num_computed + cmd.num_tokens
        tok = (tokens or {}).get(cmd.job_id, 7) if done == job.num_tokens else None
        results.append(TokenResult(cmd.job_id, done, tok, -0.5 if tok is not None else None))
    updates = core.update(plan, StepResult(results, [], elapsed), now + elapsed)
    core.check_invariants()
    return plan, updates




# Decode 10 ms at batch 1; prefill 10 ms + 1 ms per token.
LINEAR = CostModel(decode=((1, 0.010), (64, 0.020)), prefill=((1, 0.010), (1001, 1.010)))


def iteration_cost(core, plan) -> float:
    """What LINEAR says ``plan`` costs: the simulated worker's clock."""
    decodes = sum(1 for c in plan.commands if c.num_tokens == 1)
    prefill = sum(c.num_tokens for c in plan.commands if c.num_tokens > 1)
    return core.cost_model.iteration_time(decodes, prefill)
