"""The prompt workload of the benchmark (`--prompts FILE.jsonl`): real instructions as chat
messages with natural lengths, each once in a seeded order, per-request sampling seeds; sent
to an OpenAI-compatible server (the fake one) with the lengths the model chose recorded."""

from __future__ import annotations

import itertools
import json
import math

import pytest
from fake_openai import answer_length, start

from fastserve.bench.prompts import ChatPrompt, load_instructions, prompt_workload
from fastserve.cli import main

TEXTS = ["Write a haiku about rain.", "What is 2 + 2?", "Explain TCP slow start briefly.",
         "Name three rivers in Africa.", "Why is the sky blue?"]


@pytest.fixture
def prompts_file(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text("".join(json.dumps({"id": i, "instruction": t}) + "\n"
                            for i, t in enumerate(TEXTS)))
    return path


def test_every_prompt_once_in_a_seeded_order_with_its_own_seed(prompts_file):
    trace, prompts = prompt_workload(prompts_file, rate=2.0, seed=3, max_tokens=64,
                                     temperature=0.2, top_p=0.9)
    assert sorted(p.text for p in prompts) == sorted(TEXTS)
    assert len({p.seed for p in prompts}) == len(TEXTS)
    assert all(p == ChatPrompt(p.text, 64, 0.2, 0.9, p.seed) for p in prompts)
    assert [r.output_tokens for r in trace] == [64] * 5 and trace[0].arrival_s == 0.0
    assert all(a.arrival_s < b.arrival_s for a, b in itertools.pairwise(trace))
    again = prompt_workload(prompts_file, rate=2.0, seed=3, max_tokens=64)[1]
    assert [p.text for p in again] == [p.text for p in prompts]
    other = prompt_workload(prompts_file, rate=2.0, seed=4)[1]
    assert [p.text for p in other] != [p.text for p in prompts]


def test_more_requests_than_prompts_needs_repeat(prompts_file):
    with pytest.raises(ValueError, match="--repeat"):
        prompt_workload(prompts_file, rate=1.0, num_requests=7)
    _, prompts = prompt_workload(prompts_file, rate=1.0, num_requests=7, repeat=True)
    assert len(prompts) == 7 and {p.text for p in prompts} == set(TEXTS)


@pytest.mark.parametrize(("line", "message"), [
    ('{"instruction": ""}', "non-empty string field 'instruction'"),
    ('{"text": "hi"}', "'instruction'"),
    ("not json", "not valid JSON"),
])
def test_a_bad_line_is_named(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"instruction": "ok"}\n' + line + "\n")
    with pytest.raises(ValueError, match=message) as e:
        load_instructions(path)
    assert f"{path}:2" in str(e.value)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"rate": None}, "--rate"), ({"rate": 1.0, "top_p": 0.0}, "--top-p"),
    ({"rate": 1.0, "temperature": -1.0}, "--temperature"),
    ({"rate": 1.0, "max_tokens": 0}, "--max-tokens"),
])
def test_bad_workload_options_are_named(prompts_file, kwargs, message):
    with pytest.raises(ValueError, match=message):
        prompt_workload(prompts_file, **kwargs)


def test_bench_serve_sends_chat_prompts_and_records_the_lengths_the_model_chose(
        prompts_file, tmp_path, capsys):
    fake = start()
    try:
        out = tmp_path / "run.json"
        rc = main(["bench", "serve", "--openai-url", fake.url, "--prompts", str(prompts_file),
                   "--rate", "50", "--max-tokens", "6", "--temperature", "0.2", "--top-p",
                   "0.9", "--json", str(out), "--no-progress"])
        printed = capsys.readouterr().out
        assert rc == 0, printed
        chats = [b for b in fake.bodies if "messages" in b]
    finally:
        fake.shutdown()
        fake.server_close()
    assert sorted(b["messages"][0]["content"] for b in chats) == sorted(TEXTS)
    assert all(b["messages"][0]["role"] == "user" and "ignore_eos" not in b
               and (b["max_tokens"], b["temperature"], b["top_p"]) == (6, 0.2, 0.9)
               for b in chats)
    assert len({b["seed"] for b in chats}) == len(TEXTS)
    run = json.loads(out.read_text())
    for rec in run["requests"]:  # its prompt, found by the lengths the server reported
        text = next(t for t in TEXTS if len(t.split()) == rec["input_tokens"]
                    and min(answer_length(t), 6) == rec["output_tokens"])
        assert rec["finish_reason"] == ("length" if answer_length(text) >= 6 else "stop")
    assert run["summary"]["num_completed"] == 5
    assert run["summary"]["num_length_capped"] == sum(answer_length(t) >= 6 for t in TEXTS)
    assert run["config"]["prompts"] == str(prompts_file) and "natural lengths" in printed


def test_trace_and_prompts_are_exclusive(prompts_file, capsys):
    assert main(["bench", "serve", "--prompts", str(prompts_file)]) == 2
    assert "--rate" in capsys.readouterr().err
    assert main(["bench", "serve", "--rate", "1"]) == 2
    assert "exactly one of --trace" in capsys.readouterr().err


def test_the_oracle_is_told_the_lengths_of_an_earlier_run():
    from fastserve.bench.compare import _with_hints

    prompts = [ChatPrompt(t, 64, 0.2, 0.9, i) for i, t in enumerate(TEXTS[:3])]
    hinted = _with_hints(prompts, [12, None, 40])
    assert [p.output_length_hint for p in hinted] == [12, None, 40]
    assert [p.text for p in hinted] == [p.text for p in prompts]
    assert _with_hints(prompts, None) == prompts  # nothing measured: warned, unchanged


def test_the_predictors_error_is_summarized_over_predicted_requests():
    from fastserve.bench.serve import prediction_error

    recs = [{"error": None, "output_tokens": n, "predicted_output_tokens": p}
            for n, p in ((10, 12.0), (50, 30.0), (100, 90.0), (20, None))]
    recs.append({"error": "boom", "output_tokens": 5, "predicted_output_tokens": 500.0})
    s = prediction_error(recs)
    assert s["num_predicted"] == 3
    assert s["prediction_mae_tokens"] == pytest.approx((2 + 20 + 10) / 3)
    assert s["prediction_spearman"] == pytest.approx(1.0)
    assert prediction_error(recs[3:]) == {"num_predicted": 0}


def test_spearman_averages_ties():
    from fastserve.predictor.rank import ranks, spearman

    assert ranks([3, 1, 2, 2]).tolist() == [3.0, 0.0, 1.5, 1.5]
    assert spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert math.isnan(spearman([1, 1, 1], [1, 2, 3]))
