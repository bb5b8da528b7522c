"""fastserve.traces: formats, scaling and caps, repetition, rates and arrivals, errors."""

from __future__ import annotations

import itertools
import json
import pathlib

import numpy as np
import pytest

from fastserve.traces import TraceRequest, describe, detect_format, load_trace

SHARED = pathlib.Path(__file__).resolve().parents[3] / "shared" / "traces"


def write(path: pathlib.Path, text: str) -> pathlib.Path:
    path.write_text(text)
    return path


@pytest.fixture
def azure(tmp_path):
    # Out of order on purpose; 7 fractional digits as in the real files.
    return write(tmp_path / "azure.csv", "TIMESTAMP,ContextTokens,GeneratedTokens\n"
                 "2023-11-16 18:15:46.5000000,100,10\n"
                 "2023-11-16 18:15:48.5000000,300,30\n"
                 "2023-11-16 18:15:47.0000000,200,20\n")


@pytest.fixture
def sharegpt(tmp_path):
    return write(tmp_path / "sg.csv", "num_prefill_tokens,num_decode_tokens,num_total_tokens,"
                 "pd_ratio\n74,918,992,0.08\n290,905,1195,0.32\n16,4,20,4.0\n")


@pytest.fixture
def jsonl(tmp_path):
    rows = [{"arrival_s": 10.0, "input_tokens": 5, "output_tokens": 7},
            {"arrival_s": 12.5, "input_tokens": 6, "output_tokens": 8}]
    return write(tmp_path / "t.jsonl", "".join(json.dumps(r) + "\n" for r in rows))


def test_azure_keeps_real_relative_timestamps_sorted(azure):
    assert detect_format(azure) == "azure"
    assert load_trace(azure) == [TraceRequest(0.0, 100, 10), TraceRequest(0.5, 200, 20),
                                 TraceRequest(2.0, 300, 30)]


def test_asked_for_arrivals_replace_a_traces_timestamps_and_keep_its_lengths(azure):
    real = load_trace(azure, num_requests=300)
    bursty = load_trace(azure, num_requests=300, arrivals="gamma", cv=4.0, rate=2.0)
    assert [(r.input_tokens, r.output_tokens) for r in bursty] == [
        (r.input_tokens, r.output_tokens) for r in real]
    assert [r.arrival_s for r in bursty] != [r.arrival_s for r in real]
    info = describe(bursty)
    assert info["interarrival_cv"] > 2.0 and info["mean_rate"] == pytest.approx(2.0, rel=0.5)
    # Without a rate: the trace's own mean rate.
    own = describe(real)["mean_rate"]
    poisson = describe(load_trace(azure, num_requests=300, arrivals="poisson"))
    assert poisson["mean_rate"] == pytest.approx(own, rel=0.3)
    assert load_trace(azure, num_requests=300, arrivals=None) == real


def test_azure_rate_rescales_to_the_measured_mean_rate(azure):
    trace = load_trace(azure, rate=4.0)
    arrivals = [r.arrival_s for r in trace]
    assert arrivals == pytest.approx([0.0, 0.125, 0.5])  # same shape, 4x faster
    assert describe(trace)["mean_rate"] == pytest.approx(4.0)


def test_sharegpt_needs_a_rate_and_gets_poisson_arrivals(sharegpt):
    assert detect_format(sharegpt) == "sharegpt"
    with pytest.raises(ValueError, match=r"sg\.csv.*no arrival times.*rate"):
        load_trace(sharegpt)
    trace = load_trace(sharegpt, rate=2.0)
    assert [(r.input_tokens, r.output_tokens) for r in trace] == [(74, 918), (290, 905),
                                                                  (16, 4)]
    assert trace[0].arrival_s == 0.0
    assert all(a.arrival_s < b.arrival_s for a, b in itertools.pairwise(trace))
    assert load_trace(sharegpt, rate=2.0) == trace  # seeded
    assert load_trace(sharegpt, rate=2.0, seed=1) != trace


def test_jsonl_with_and_without_arrivals(jsonl, tmp_path):
    assert detect_format(jsonl) == "jsonl"
    assert load_trace(jsonl) == [TraceRequest(0.0, 5, 7), TraceRequest(2.5, 6, 8)]
    lengths = write(tmp_path / "lengths.jsonl", '{"input_tokens": 3, "output_tokens": 4}\n')
    with pytest.raises(ValueError, match="no arrival times"):
        load_trace(lengths)
    assert load_trace(lengths, rate=1.0) == [TraceRequest(0.0, 3, 4)]


def test_lengths_are_scaled_rounded_at_least_one_then_capped(azure):
    trace = load_trace(azure, length_scale=40, max_input=6)
    assert [(r.input_tokens, r.output_tokens) for r in trace] == [(2, 1), (5, 1), (6, 1)]
    trace = load_trace(azure, max_input=150, max_output=25)
    assert [(r.input_tokens, r.output_tokens) for r in trace] == [(100, 10), (150, 20),
                                                                  (150, 25)]


def test_num_requests_takes_the_first_ones_by_arrival(azure):
    trace = load_trace(azure, num_requests=2)
    assert trace == [TraceRequest(0.0, 100, 10), TraceRequest(0.5, 200, 20)]
    # The rate applies to what is replayed.
    assert describe(load_trace(azure, num_requests=2, rate=1.0))["mean_rate"] == 1.0


def test_a_short_trace_repeats_shifted_by_its_span_plus_a_mean_gap(azure):
    trace = load_trace(azure, num_requests=7)
    span, gap = 2.0, 1.0  # 3 requests over 2 s
    assert [r.arrival_s for r in trace] == pytest.approx(
        [0.0, 0.5, 2.0, 3.0, 3.5, 5.0, 6.0])
    assert trace[3].arrival_s == pytest.approx(span + gap)
    assert [r.input_tokens for r in trace] == [100, 200, 300] * 2 + [100]
    # Repetition keeps the mean rate, and rescaling still hits the asked one.
    assert describe(trace)["mean_rate"] == pytest.approx(1.0)
    assert describe(load_trace(azure, num_requests=50, rate=3.0))["mean_rate"] == (
        pytest.approx(3.0))


def test_lengths_only_traces_repeat_their_lengths_with_fresh_arrivals(sharegpt):
    trace = load_trace(sharegpt, rate=5.0, num_requests=8)
    assert [r.input_tokens for r in trace] == [74, 290, 16] * 2 + [74, 290]
    assert all(a.arrival_s < b.arrival_s for a, b in itertools.pairwise(trace))


@pytest.mark.parametrize("arrivals,cv", [("poisson", 1.0), ("gamma", 0.5), ("gamma", 3.0)])
def test_synthesized_arrivals_have_the_rate_and_cv(tmp_path, arrivals, cv):
    lengths = write(tmp_path / "l.jsonl", '{"input_tokens": 3, "output_tokens": 4}\n')
    trace = load_trace(lengths, rate=8.0, arrivals=arrivals, cv=cv, num_requests=40_000)
    gaps = np.diff([r.arrival_s for r in trace])
    assert gaps.mean() == pytest.approx(1 / 8.0, rel=0.05)
    assert gaps.std() / gaps.mean() == pytest.approx(cv, rel=0.08)
    info = describe(trace)
    assert info["mean_rate"] == pytest.approx(8.0, rel=0.05)
    assert info["interarrival_cv"] == pytest.approx(cv, rel=0.08)


def test_describe(azure):
    info = describe(load_trace(azure))
    assert info["count"] == 3
    assert info["mean_input_tokens"] == 200 and info["mean_output_tokens"] == 20
    assert info["p99_input_tokens"] == pytest.approx(298.0)
    assert info["mean_rate"] == pytest.approx(1.0)
    assert describe([]) == {"count": 0}


@pytest.mark.parametrize("text,match", [
    (("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,100,10\n"
      "2023-11-16 18:15:47.5,abc,10\n"), r"bad\.csv:3: field 'ContextTokens'.*'abc'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,100,-4\n",
     r"bad\.csv:2: field 'GeneratedTokens'.*non-negative integer"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,100,10\n",
     r"bad\.csv:2: field 'TIMESTAMP'.*'yesterday'"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46.5,100\n",
     r"bad\.csv:2: expected 3 fields"),
    ("num_prefill_tokens,num_decode_tokens\n12,4.5\n", r"bad\.csv:2: field 'num_decode_tokens'"),
    ("a,b,c\n1,2,3\n", r"bad\.csv:1: unknown trace format"),
    ("TIMESTAMP,ContextTokens,GeneratedTokens\n", r"bad\.csv: the trace has no requests"),
])
def test_bad_csv_files_name_the_file_line_and_field(tmp_path, text, match):
    with pytest.raises(ValueError, match=match):
        load_trace(write(tmp_path / "bad.csv", text), rate=1.0)


@pytest.mark.parametrize("lines,match", [
    (['{"arrival_s": 0, "input_tokens": 3, "output_tokens": 4}', "{nope"],
     r"bad\.jsonl:2: not valid JSON"),
    (['{"arrival_s": 0, "input_tokens": 3}'], r"bad\.jsonl:1: field 'output_tokens' is missing"),
    (['{"arrival_s": 0, "input_tokens": 3, "output_tokens": 4}',
      '{"arrival_s": 1, "input_tokens": "x", "output_tokens": 4}'],
     r"bad\.jsonl:2: field 'input_tokens'"),
    (['{"arrival_s": 0, "input_tokens": 3, "output_tokens": 4}',
      '{"input_tokens": 3, "output_tokens": 4}'], r"bad\.jsonl:2: field 'arrival_s'"),
    (['{"arrival_s": "soon", "input_tokens": 3, "output_tokens": 4}'],
     r"bad\.jsonl:1: field 'arrival_s'"),
    (["[1, 2, 3]"], r"bad\.jsonl:1: expected a JSON object"),
])
def test_bad_jsonl_lines_name_the_file_line_and_field(tmp_path, lines, match):
    with pytest.raises(ValueError, match=match):
        load_trace(write(tmp_path / "bad.jsonl", "\n".join(lines) + "\n"))


@pytest.mark.parametrize("kwargs,match", [
    ({"rate": 0}, "rate must be > 0"), ({"rate": -1.0}, "rate must be > 0"),
    ({"arrivals": "uniform"}, "arrivals must be one of"), ({"cv": 0}, "cv must be > 0"),
    ({"length_scale": 0}, "length_scale must be > 0"), ({"max_input": 0}, "max_input"),
    ({"num_requests": 0}, "num_requests"), ({"fmt": "parquet"}, "format must be one of"),
])
def test_bad_options(jsonl, kwargs, match):
    with pytest.raises(ValueError, match=match):
        load_trace(jsonl, **kwargs)


def test_a_missing_file_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read the trace"):
        load_trace(tmp_path / "nope.csv")


def test_simultaneous_arrivals_cannot_be_rescaled(tmp_path):
    path = write(tmp_path / "same.jsonl", '{"arrival_s": 1, "input_tokens": 3, '
                 '"output_tokens": 4}\n' * 3)
    assert [r.arrival_s for r in load_trace(path)] == [0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="same time"):
        load_trace(path, rate=2.0)


@pytest.mark.skipif(not SHARED.is_dir(), reason="the shared traces are not here")
def test_the_shared_traces_load_as_their_readme_says():
    conv = describe(load_trace(SHARED / "AzureLLMInferenceTrace_conv.csv"))
    assert conv["count"] == 19366
    assert conv["mean_rate"] == pytest.approx(5.5, abs=0.1)
    assert conv["mean_input_tokens"] == pytest.approx(1155, abs=1)
    code = describe(load_trace(SHARED / "AzureLLMInferenceTrace_code.csv"))
    assert code["count"] == 8819 and code["interarrival_cv"] == pytest.approx(13, abs=0.5)
    sg = load_trace(SHARED / "sharegpt_lengths_llama2.csv", rate=1.0, num_requests=100,
                    length_scale=8, max_input=512, max_output=64)
    assert len(sg) == 100 and max(r.input_tokens for r in sg) <= 512
    assert max(r.output_tokens for r in sg) <= 64
