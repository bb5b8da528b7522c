"""Translation between the scheduler core's plans/results and the worker's Step messages."""

from __future__ import annotations

from fastserve.proto import worker_pb2 as wpb
from scheduler_svc.core.contract import StepPlan, StepResult, TokenResult
from scheduler_svc.core.job import Sampling


def sampling_to_proto(s: Sampling) -> wpb.SamplingParams:
    msg = wpb.SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
    if s.seed is not None:
        msg.seed = s.seed
    return msg


def plan_to_proto(plan: StepPlan) -> wpb.StepRequest:
    return wpb.StepRequest(
        step_id=plan.step_id,
        new_jobs=[
            wpb.NewJob(job_id=n.job_id, prompt_token_ids=n.prompt, output_token_ids=n.output,
                       sampling=sampling_to_proto(n.sampling), block_ids=n.block_ids)
            for n in plan.new_jobs
        ],
        commands=[
            wpb.JobCommand(job_id=c.job_id, num_tokens=c.num_tokens,
                           append_block_ids=c.append_block_ids)
            for c in plan.commands
        ],
        free_job_ids=plan.free_job_ids,
        swap_out=[wpb.SwapOut(job_id=j) for j in plan.swap_out],
        swap_in=[wpb.SwapIn(job_id=sw.job_id, block_ids=sw.block_ids) for sw in plan.swap_in],
    )


# A swap that failed on the worker: the job's KV is gone and the worker forgot the job, so it
# is recomputed (re-created with its output tokens), never failed.
KV_LOST = wpb.ERROR_CODE_DATA_LOSS
# A refused swap-out (store full or unreachable): the job keeps its KV on the device.
SWAP_REFUSED = (wpb.ERROR_CODE_RESOURCE_EXHAUSTED, wpb.ERROR_CODE_UNAVAILABLE)


def result_from_proto(msg: wpb.StepResponse) -> StepResult:
    return StepResult(
        results=[
            TokenResult(
                r.job_id, r.num_computed_tokens,
                r.token_id if r.HasField("token_id") else None,
                r.logprob if r.HasField("logprob") else None,
                (r.predicted_remaining_tokens if r.HasField("predicted_remaining_tokens")
                 else None),
            )
            for r in msg.results
        ],
        # Errors for jobs the scheduler already forgot (a free of a job the worker lost) are
        # harmless; the core ignores ids it does not know.
        errors=[(e.job_id, f"{wpb.ErrorCode.Name(e.code)}: {e.message}") for e in msg.errors
                if e.code != KV_LOST],
        compute_time_s=msg.compute_time_s,
        kv_lost=[e.job_id for e in msg.errors if e.code == KV_LOST],
        # The core reads these only for the jobs its plan swapped out.
        swap_refused=[e.job_id for e in msg.errors if e.code in SWAP_REFUSED],
        swap_wait_s=msg.swap_wait_s,
    )
