"""Translation between the scheduler core's plans/results and the worker's Step messages."""

from __future__ import annotations

from fastserve.proto import worker_pb2 as wpb
from scheduler_svc.core.contract import StepPlan, StepResult, TokenResult
from scheduler_svc.core.job import Sampling
from scheduler_svc.core.job_id import JobId


def sampling_to_proto(s: Sampling) -> wpb.SamplingParams:
    msg = wpb.SamplingParams(temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
                             min_tokens=s.min_tokens, suppress_token_ids=s.suppress)
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
        probes=[wpb.ArrivalProbe(job_id=p.job_id, token_ids=p.token_ids,
                                 prompt_tokens=p.prompt_tokens) for p in plan.probes],
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
                JobId(r.job_id), r.num_computed_tokens,
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
        estimates=[(e.job_id, e.predicted_output_tokens) for e in msg.estimates],
    )


class BadWorkerReply(ConnectionError):
    """A worker's Describe or Step answer that breaks the protocol: the worker is treated as
    lost (its jobs fail with UNAVAILABLE and this message), never believed."""


def check_describe(d: wpb.DescribeResponse) -> None:
    """Refuse a Describe that no core can be built on (sizes, the eos ids)."""
    for name, low in (("num_blocks", 1), ("block_size", 1), ("max_context", 2),
                      ("vocab_size", 1)):
        if getattr(d, name) < low:
            raise BadWorkerReply(f"worker's Describe: {name} = {getattr(d, name)}, at least "
                                 f"{low} expected")
    bad = [t for t in d.eos_token_ids if not 0 <= t < d.vocab_size]
    if bad:
        raise BadWorkerReply(f"worker's Describe: eos_token_ids {bad[:4]} outside "
                             f"[0, vocab_size={d.vocab_size})")


def check_result(plan: StepPlan, result: StepResult, vocab_size: int) -> None:
    """Refuse a Step answer that speaks of jobs the plan did not command, twice of one job,
    or of token ids outside the vocabulary."""
    commanded = {c.job_id for c in plan.commands}
    seen: set[int] = set()
    for r in result.results:
        if r.job_id not in commanded:
            raise BadWorkerReply(f"worker answered step {plan.step_id} for job {r.job_id}, "
                                 "which it did not command")
        if r.job_id in seen:
            raise BadWorkerReply(f"worker answered step {plan.step_id} twice for job {r.job_id}")
        seen.add(r.job_id)
        if r.token_id is not None and not 0 <= r.token_id < vocab_size:
            raise BadWorkerReply(f"worker answered step {plan.step_id} with token id "
                                 f"{r.token_id} for job {r.job_id}, outside [0, {vocab_size})")
        if r.num_computed < 0:
            raise BadWorkerReply(f"worker answered step {plan.step_id} with num_computed "
                                 f"{r.num_computed} for job {r.job_id}")
    probed = {p.job_id for p in plan.probes}
    for job_id, predicted in result.estimates:
        if job_id not in probed:
            raise BadWorkerReply(f"worker estimated job {job_id} in step {plan.step_id}, "
                                 "which it was not asked to")
        if not 0 < predicted < float("inf"):
            raise BadWorkerReply(f"worker estimated job {job_id} in step {plan.step_id} at "
                                 f"{predicted} output tokens, not a positive number")
