"""Proto <-> engine dataclass translation, and the code generator that makes the protos."""

from __future__ import annotations

import pathlib
import textwrap

from hypothesis import given
from hypothesis import strategies as st

from fastserve.proto import build
from fastserve.proto import worker_pb2 as pb
from worker_svc import wire
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

uint64 = st.integers(0, 2**64 - 1)
int32 = st.integers(-(2**31), 2**31 - 1)
uint32 = st.integers(0, 2**32 - 1)
float32 = st.floats(width=32, allow_nan=False)
ids = st.lists(int32, max_size=5)

sampling = st.builds(
    SamplingParams,
    temperature=float32,
    top_p=float32.filter(lambda x: x != 0.0),  # 0 on the wire means "off", i.e. 1.0
    top_k=int32,
    seed=st.none() | uint64,
)
step_commands = st.builds(
    StepCommand,
    new_jobs=st.lists(st.builds(NewJob, uint64, ids, sampling, ids), max_size=3),
    commands=st.lists(st.builds(JobCommand, uint64, int32, ids), max_size=3),
    free_job_ids=st.lists(uint64, max_size=3),
    swap_out=st.lists(uint64, max_size=3),
    swap_in=st.lists(st.builds(SwapIn, uint64, ids), max_size=3),
    probes=st.lists(st.builds(ArrivalProbe, uint64, ids, uint32), max_size=3),
)
swap_stats = st.builds(
    SwapStats,
    num_blocks_out=uint32,
    num_bytes_out=uint64,
    num_blocks_in=uint32,
    num_bytes_in=uint64,
    copy_time_s=st.floats(allow_nan=False),
    num_swap_ins_hidden=uint32,
    num_swap_ins_waited=uint32,
    failures=st.dictionaries(st.text(), uint32, max_size=3),
    store_free_blocks=st.none() | uint64,
    num_offloaded_jobs=uint32,
    num_copies_in_flight=uint32,
)
step_outcomes = st.builds(
    StepOutcome,
    results=st.lists(
        st.builds(JobResult, uint64, uint32, st.none() | int32, st.none() | float32), max_size=3
    ),
    errors=st.lists(st.builds(JobError, uint64, st.sampled_from(ErrorCode), st.text()), max_size=3),
    compute_time_s=st.floats(allow_nan=False),
    swap_wait_s=st.floats(allow_nan=False),
    swap=swap_stats,
    estimates=st.lists(st.builds(ArrivalEstimate, uint64, float32), max_size=3),
)


@given(step_commands, uint64)
def test_step_command_round_trip(cmd, step_id):
    msg = pb.StepRequest.FromString(wire.step_command_to_proto(cmd, step_id).SerializeToString())
    assert msg.step_id == step_id
    assert wire.step_command_from_proto(msg) == (cmd, [])


@given(step_outcomes, uint64, uint32, uint32)
def test_step_outcome_round_trip(out, step_id, used, free):
    msg = wire.step_outcome_to_proto(out, step_id, used, free)
    msg = pb.StepResponse.FromString(msg.SerializeToString())
    assert (msg.step_id, msg.num_used_blocks, msg.num_free_blocks) == (step_id, used, free)
    assert wire.step_outcome_from_proto(msg) == out


def test_error_codes_are_grpc_status_codes():
    import grpc

    for code in ErrorCode:
        assert pb.ErrorCode.Value(f"ERROR_CODE_{code.name}") == code.value
        assert grpc.StatusCode[code.name].value[0] == code.value


def test_unset_sampling_is_greedy_without_truncation():
    params = wire.sampling_from_proto(pb.SamplingParams())
    assert params == SamplingParams(temperature=0.0, top_p=1.0, top_k=0, seed=None)
    assert params.greedy


def test_job_that_fails_to_translate_is_a_per_job_error(monkeypatch):
    real = wire.new_job_from_proto

    def flaky(msg: pb.NewJob) -> NewJob:
        if msg.job_id == 2:
            raise ValueError("cannot translate")
        return real(msg)

    monkeypatch.setattr(wire, "new_job_from_proto", flaky)
    request = pb.StepRequest(
        new_jobs=[
            pb.NewJob(job_id=1, prompt_token_ids=[1]),
            pb.NewJob(job_id=2, prompt_token_ids=[2]),
        ],
        commands=[pb.JobCommand(job_id=1, num_tokens=1)],
    )
    cmd, errors = wire.step_command_from_proto(request)
    assert [j.job_id for j in cmd.new_jobs] == [1] and len(cmd.commands) == 1
    assert [(e.job_id, e.code) for e in errors] == [(2, ErrorCode.INVALID_ARGUMENT)]
    assert "new_jobs[1]" in errors[0].message and "cannot translate" in errors[0].message


def test_profile_round_trip():
    profile = Profile(
        "abc",
        [DecodePoint(1, 129, 0.5), DecodePoint(2, 130, 0.75)],
        [PrefillPoint(16, 0.25)],
        measured_at_unix_s=1.5e9,
        cached=True,
    )
    msg = pb.ProfileResponse.FromString(wire.profile_to_proto(profile).SerializeToString())
    assert wire.profile_from_proto(msg) == profile


def test_rewrite_imports_prefixes_generated_packages_only():
    src = textwrap.dedent("""\
        import grpc
        from google.protobuf import descriptor as _descriptor
        from fastserve.v1 import worker_pb2 as fastserve_dot_v1_dot_worker__pb2
        import fastserve.v2.other_pb2
        from fastserve.version import x
    """)
    assert build.rewrite_imports(src) == textwrap.dedent("""\
        import grpc
        from google.protobuf import descriptor as _descriptor
        from fastserve.proto.fastserve.v1 import worker_pb2 as fastserve_dot_v1_dot_worker__pb2
        import fastserve.proto.fastserve.v2.other_pb2
        from fastserve.version import x
    """)


def test_build_rewrites_cross_proto_imports(tmp_path: pathlib.Path):
    protos = tmp_path / "protos" / "fastserve" / "v1"
    protos.mkdir(parents=True)
    (protos / "a.proto").write_text('syntax = "proto3"; package fastserve.v1; message A {}')
    (protos / "b.proto").write_text(
        textwrap.dedent("""\
        syntax = "proto3";
        package fastserve.v1;
        import "fastserve/v1/a.proto";
        import "google/protobuf/empty.proto";
        message B { A a = 1; }
        service S { rpc Get(google.protobuf.Empty) returns (B); }
    """)
    )
    out = tmp_path / "pkg" / "fastserve"
    out.parent.mkdir()
    (out / "v1").mkdir(parents=True)
    (out / "v1" / "stale_pb2.py").write_text("")

    written = build.build(tmp_path / "protos", out)

    names = sorted(p.relative_to(out).as_posix() for p in written)
    assert names == [
        "__init__.py",
        "v1/__init__.py",
        "v1/a_pb2.py",
        "v1/a_pb2.pyi",
        "v1/a_pb2_grpc.py",
        "v1/b_pb2.py",
        "v1/b_pb2.pyi",
        "v1/b_pb2_grpc.py",
    ]
    for name in ("b_pb2.py", "b_pb2_grpc.py"):
        text = (out / "v1" / name).read_text()
        assert "from fastserve.proto.fastserve.v1 import " in text
        assert "from fastserve.v1 import" not in text
        assert "from google.protobuf import empty_pb2" in text
    assert sorted(p.name for p in out.parent.iterdir()) == ["fastserve"]  # no temp dirs left


def test_generated_modules_are_up_to_date(tmp_path: pathlib.Path):
    fresh = tmp_path / "fastserve"
    build.build(build.PROTO_ROOT, fresh)
    for path in sorted(fresh.rglob("*.py*")):
        current = build.OUT / path.relative_to(fresh)
        assert current.is_file() and current.read_text() == path.read_text(), (
            f"{current} is stale: run `make proto`"
        )
