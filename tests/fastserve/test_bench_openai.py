"""The benchmark's OpenAI client path (`bench serve --openai-url`, `bench compare --peer`)
against a small fake OpenAI-compatible server (tests/fastserve/fake_openai.py)."""

from __future__ import annotations

import json
import pathlib
import sys

import pytest
from fake_openai import MAX_PROMPT, MODEL, start
from procs import free_port

from fastserve.bench.peers import peer_specs
from fastserve.cli import main


def _trace(path: pathlib.Path, lengths: list[tuple[int, int]]) -> pathlib.Path:
    path.write_text("".join(
        json.dumps({"arrival_s": i * 0.02, "input_tokens": a, "output_tokens": b}) + "\n"
        for i, (a, b) in enumerate(lengths)))
    return path


@pytest.fixture
def fake():
    server = start()
    yield server
    server.shutdown()
    server.server_close()


def test_bench_serve_replays_exact_lengths_against_an_openai_server(fake, tmp_path, capsys):
    lengths = [(5 + 3 * i, 1 + i % 7) for i in range(12)]
    out = tmp_path / "run.json"
    rc = main(["bench", "serve", "--openai-url", fake.url, "--trace",
               str(_trace(tmp_path / "t.jsonl", lengths)), "--json", str(out), "--no-progress",
               "--name", "peer"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    run = json.loads(out.read_text())
    assert run["summary"]["policy"] == "peer"
    assert (run["summary"]["num_completed"], run["summary"]["num_failed"]) == (12, 0)
    assert run["config"]["server"]["model"] == MODEL
    recs = sorted(run["requests"], key=lambda r: r["index"])
    assert [r["output_tokens"] for r in recs] == [b for _, b in lengths]
    assert all(r["first_token"] <= r["finish"] and r["finish_reason"] == "length" for r in recs)
    timed = fake.bodies[1:]  # the first is the warm-up
    assert sorted(len(b["prompt"]) for b in timed) == sorted(a for a, _ in lengths)
    assert all(b["ignore_eos"] is True and b["temperature"] == 0.0 and b["stream"] is True
               and b["stream_options"] == {"include_usage": True} for b in timed)
    assert "peer" in printed


def test_a_refused_request_is_a_counted_failure_with_the_servers_message(fake, tmp_path,
                                                                          capsys):
    lengths = [(8, 3), (MAX_PROMPT + 1, 3), (9, 2)]
    out = tmp_path / "run.json"
    rc = main(["bench", "serve", "--openai-url", fake.url + "/v1", "--trace",
               str(_trace(tmp_path / "t.jsonl", lengths)), "--json", str(out), "--no-progress",
               "--warmup", "0"])
    capsys.readouterr()
    assert rc == 1  # a failed request fails the command
    run = json.loads(out.read_text())
    assert (run["summary"]["num_completed"], run["summary"]["num_failed"]) == (2, 1)
    bad = next(r for r in run["requests"] if r["input_tokens"] == MAX_PROMPT + 1)
    assert bad["error"].startswith("HTTP 400") and "limit is 64" in bad["error"]


def test_an_unreachable_server_is_an_error_not_a_hang(tmp_path, capsys):
    rc = main(["bench", "serve", "--openai-url", f"http://127.0.0.1:{free_port()}", "--trace",
               str(_trace(tmp_path / "t.jsonl", [(4, 2)])), "--no-progress"])
    assert rc == 1
    assert "cannot list models" in capsys.readouterr().err


def test_compare_starts_a_fresh_peer_per_run_and_reports_it_beside_the_others(tmp_path,
                                                                               capsys):
    port = free_port()
    script = pathlib.Path(__file__).with_name("fake_openai.py")
    lengths = [(6 + i, 2 + i % 3) for i in range(8)]
    out = tmp_path / "summaries.json"
    rc = main(["bench", "compare", "--peer", f"fake=http://127.0.0.1:{port}",
               "--peer-cmd", f"fake={sys.executable} {script} {port}",
               "--peer", f"twice=http://127.0.0.1:{port}",  # not started: gone after each run
               "--rates", "20,40", "--trace", str(_trace(tmp_path / "t.jsonl", lengths)),
               "--out-dir", str(tmp_path / "out"), "--json", str(out), "--no-progress",
               "--no-plots", "--peer-start-timeout", "30"])
    captured = capsys.readouterr()
    assert rc == 1  # the unstarted peer's runs failed, and say so
    summaries = json.loads(out.read_text())
    assert [(s["policy"], s["rate"]) for s in summaries] == [("fake", 20.0), ("fake", 40.0)]
    assert all(s["num_completed"] == 8 and s["num_failed"] == 0 for s in summaries)
    assert "twice at rate 20" in captured.err and "twice at rate 40" in captured.err


@pytest.mark.parametrize("peers,cmds,models,message", [
    (["vllm"], [], [], "--peer must be NAME=VALUE"),
    (["a=http://x", "a=http://y"], [], [], "names 'a' twice"),
    (["a=http://x"], ["b=run"], [], "--peer-cmd names b"),
    (["a=http://x"], [], ["c=m"], "--peer-model names c"),
])
def test_peer_options_are_checked(peers, cmds, models, message):
    with pytest.raises(ValueError, match=message):
        peer_specs(peers, cmds, models)
