"""Translation between the scheduler core's plans/results and the worker's Step messages."""

from __future__ import annotations

from fastserve.proto import worker_pb2 as wpb
from scheduler_svc.core.job import Job
from scheduler_svc.core.scheduler import StepPlan, StepResult, TokenResult


def sampling_to_proto(job: Job) -> wpb.SamplingParams:
    s = job.sampling
    msg = wpb.SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
    if s.seed is not None:
        msg.seed = s.seed
    return msg


def plan_to_proto(plan: StepPlan, step_id: int) -> wpb.StepRequest:
    return wpb.StepRequest(
        step_id=step_id,
        new_jobs=[
            wpb.NewJob(job_id=n.job_id, prompt_token_ids=n.prompt, output_token_ids=n.output,
                       sampling=sampling_to_proto(n.job), block_ids=n.block_ids)
            for n in plan.new_jobs
        ],
        commands=[
            wpb.JobCommand(job_id=c.job_id, num_tokens=c.num_tokens,
                           append_block_ids=c.append_block_ids)
            for c in plan.commands
        ],
        free_job_ids=plan.free_job_ids,
    )


def result_from_proto(msg: wpb.StepResponse) -> StepResult:
    return StepResult(
        results=[
            TokenResult(
                r.job_id, r.num_computed_tokens,
                r.token_id if r.HasField("token_id") else None,
                r.logprob if r.HasField("logprob") else None,
            )
            for r in msg.results
        ],
        # Errors for jobs the scheduler already forgot (a free of a job the worker lost) are
        # harmless; the core ignores ids it does not know.
        errors=[(e.job_id, f"{wpb.ErrorCode.Name(e.code)}: {e.message}") for e in msg.errors],
        compute_time_s=msg.compute_time_s,
    )
