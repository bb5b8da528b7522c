"""Translation between the worker's protos and the engine's dataclasses.

Both directions exist for every Step message: the worker uses ``*_from_proto`` for requests and
``*_to_proto`` for responses, tests and tools the reverse, and the round trip is the identity.
Proto3 has no "unset" for scalars, so the zero value of a sampling field means "off":
``top_p == 0`` arrives as 1.0.
"""

from __future__ import annotations

from fastserve.proto import worker_pb2 as pb
from worker_svc.engine import (
    ArrivalEstimate,
    ArrivalProbe,
    ErrorCode,
    JobCommand,
    JobError,
    JobResult,
    NewJob,
    StepCommand,
    StepOutcome,
    SwapIn,
    SwapStats,
)
from worker_svc.profiler import DecodePoint, PrefillPoint, Profile
from worker_svc.sampler import SamplingParams


def sampling_from_proto(msg: pb.SamplingParams) -> SamplingParams:
    return SamplingParams(
        temperature=msg.temperature,
        top_p=msg.top_p if msg.top_p != 0.0 else 1.0,
        top_k=msg.top_k,
        seed=msg.seed if msg.HasField("seed") else None,
        min_tokens=msg.min_tokens,
        suppress=tuple(msg.suppress_token_ids),
    )


def sampling_to_proto(params: SamplingParams) -> pb.SamplingParams:
    return pb.SamplingParams(
        temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
        seed=params.seed, min_tokens=params.min_tokens, suppress_token_ids=params.suppress,
    )


def new_job_from_proto(msg: pb.NewJob) -> NewJob:
    return NewJob(
        msg.job_id,
        list(msg.prompt_token_ids),
        sampling_from_proto(msg.sampling),
        list(msg.block_ids),
        list(msg.output_token_ids),
    )


def step_command_from_proto(msg: pb.StepRequest) -> tuple[StepCommand, list[JobError]]:
    """The engine command for a StepRequest, and errors for entries that did not translate.

    An entry that fails to translate is dropped with an INVALID_ARGUMENT error for its job;
    the rest of the Step still runs.
    """
    cmd = StepCommand(
        free_job_ids=list(msg.free_job_ids),
        swap_out=[s.job_id for s in msg.swap_out],
        swap_in=[SwapIn(s.job_id, list(s.block_ids)) for s in msg.swap_in],
        probes=[ArrivalProbe(p.job_id, list(p.token_ids), p.prompt_tokens) for p in msg.probes],
    )
    errors: list[JobError] = []
    for i, new in enumerate(msg.new_jobs):
        try:
            cmd.new_jobs.append(new_job_from_proto(new))
        except Exception as e:  # noqa: BLE001 - one bad job must not fail the Step
            errors.append(
                JobError(
                    new.job_id,
                    ErrorCode.INVALID_ARGUMENT,
                    f"new_jobs[{i}]: {type(e).__name__}: {e}",
                )
            )
    for c in msg.commands:
        cmd.commands.append(JobCommand(c.job_id, c.num_tokens, list(c.append_block_ids)))
    return cmd, errors


def step_command_to_proto(cmd: StepCommand, step_id: int = 0) -> pb.StepRequest:
    return pb.StepRequest(
        step_id=step_id,
        new_jobs=[
            pb.NewJob(
                job_id=j.job_id,
                prompt_token_ids=j.prompt_token_ids,
                sampling=sampling_to_proto(j.sampling),
                block_ids=j.block_ids,
                output_token_ids=j.output_token_ids,
            )
            for j in cmd.new_jobs
        ],
        commands=[
            pb.JobCommand(
                job_id=c.job_id, num_tokens=c.num_tokens, append_block_ids=c.append_block_ids
            )
            for c in cmd.commands
        ],
        free_job_ids=cmd.free_job_ids,
        swap_out=[pb.SwapOut(job_id=j) for j in cmd.swap_out],
        swap_in=[pb.SwapIn(job_id=s.job_id, block_ids=s.block_ids) for s in cmd.swap_in],
        probes=[pb.ArrivalProbe(job_id=p.job_id, token_ids=p.token_ids,
                                prompt_tokens=p.prompt_tokens) for p in cmd.probes],
    )


def swap_stats_to_proto(stats: SwapStats) -> pb.SwapStats:
    return pb.SwapStats(
        num_blocks_out=stats.num_blocks_out,
        num_bytes_out=stats.num_bytes_out,
        num_blocks_in=stats.num_blocks_in,
        num_bytes_in=stats.num_bytes_in,
        copy_time_s=stats.copy_time_s,
        num_swap_ins_hidden=stats.num_swap_ins_hidden,
        num_swap_ins_waited=stats.num_swap_ins_waited,
        failures=stats.failures,
        store_free_blocks=stats.store_free_blocks,
        num_offloaded_jobs=stats.num_offloaded_jobs,
        num_copies_in_flight=stats.num_copies_in_flight,
    )


def swap_stats_from_proto(msg: pb.SwapStats) -> SwapStats:
    return SwapStats(
        num_blocks_out=msg.num_blocks_out,
        num_bytes_out=msg.num_bytes_out,
        num_blocks_in=msg.num_blocks_in,
        num_bytes_in=msg.num_bytes_in,
        copy_time_s=msg.copy_time_s,
        num_swap_ins_hidden=msg.num_swap_ins_hidden,
        num_swap_ins_waited=msg.num_swap_ins_waited,
        failures=dict(msg.failures),
        store_free_blocks=msg.store_free_blocks if msg.HasField("store_free_blocks") else None,
        num_offloaded_jobs=msg.num_offloaded_jobs,
        num_copies_in_flight=msg.num_copies_in_flight,
    )


def step_outcome_to_proto(
    out: StepOutcome, step_id: int, num_used_blocks: int, num_free_blocks: int
) -> pb.StepResponse:
    return pb.StepResponse(
        step_id=step_id,
        results=[
            pb.JobResult(
                job_id=r.job_id,
                num_computed_tokens=r.num_computed_tokens,
                token_id=r.token_id,
                logprob=r.logprob,
                predicted_remaining_tokens=r.predicted_remaining,
            )
            for r in out.results
        ],
        errors=[
            pb.JobError(job_id=e.job_id, code=int(e.code), message=e.message) for e in out.errors
        ],
        compute_time_s=out.compute_time_s,
        num_used_blocks=num_used_blocks,
        num_free_blocks=num_free_blocks,
        swap_wait_s=out.swap_wait_s,
        swap=swap_stats_to_proto(out.swap),
        estimates=[pb.ArrivalEstimate(job_id=e.job_id,
                                      predicted_output_tokens=e.predicted_output_tokens)
                   for e in out.estimates],
    )


def step_outcome_from_proto(msg: pb.StepResponse) -> StepOutcome:
    return StepOutcome(
        results=[
            JobResult(
                r.job_id,
                r.num_computed_tokens,
                r.token_id if r.HasField("token_id") else None,
                r.logprob if r.HasField("logprob") else None,
                (r.predicted_remaining_tokens if r.HasField("predicted_remaining_tokens")
                 else None),
            )
            for r in msg.results
        ],
        errors=[JobError(e.job_id, ErrorCode(e.code), e.message) for e in msg.errors],
        compute_time_s=msg.compute_time_s,
        swap_wait_s=msg.swap_wait_s,
        swap=swap_stats_from_proto(msg.swap),
        estimates=[ArrivalEstimate(e.job_id, e.predicted_output_tokens) for e in msg.estimates],
    )


def profile_to_proto(profile: Profile) -> pb.ProfileResponse:
    return pb.ProfileResponse(
        decode=[
            pb.DecodePoint(batch_size=p.batch_size, context_len=p.context_len, time_s=p.time_s)
            for p in profile.decode
        ],
        prefill=[
            pb.PrefillPoint(num_tokens=p.num_tokens, time_s=p.time_s) for p in profile.prefill
        ],
        cache_key=profile.cache_key,
        cached=profile.cached,
        measured_at_unix_s=profile.measured_at_unix_s,
    )


def profile_from_proto(msg: pb.ProfileResponse) -> Profile:
    return Profile(
        cache_key=msg.cache_key,
        decode=[DecodePoint(p.batch_size, p.context_len, p.time_s) for p in msg.decode],
        prefill=[PrefillPoint(p.num_tokens, p.time_s) for p in msg.prefill],
        measured_at_unix_s=msg.measured_at_unix_s,
        cached=msg.cached,
    )
