"""`fastserve bench compare` end to end: real worker and scheduler processes on a tiny
random-weight model with SmolLM2's tokenizer, a 30-request JSONL trace, two policies."""

from __future__ import annotations

import json

import pytest
from procs import free_port

from fastserve.bench import serve as bench_serve
from fastserve.cli import main
from fastserve.traces import TraceRequest


def test_summarize_counts_failures_and_computes_the_figures():
    records = [
        {"arrival": 0.0, "first_token": 0.5, "finish": 2.0, "input_tokens": 4,
         "output_tokens": 4, "error": None},
        {"arrival": 1.0, "first_token": 1.5, "finish": 5.0, "input_tokens": 4,
         "output_tokens": 2, "error": None},
        {"arrival": 2.0, "first_token": None, "finish": None, "input_tokens": 4,
         "output_tokens": 0, "error": "RESOURCE_EXHAUSTED: full"},
    ]
    s = bench_serve.summarize_requests(records, "fcfs", 1.0)
    assert set(bench_serve.SUMMARY_KEYS) <= set(s)
    assert (s["num_requests"], s["num_completed"], s["num_failed"]) == (3, 2, 1)
    assert s["mean_jct_s"] == pytest.approx(3.0)
    assert s["mean_ttft_s"] == pytest.approx(0.5)
    assert s["mean_latency_per_token_s"] == pytest.approx((0.5 + 2.0) / 2)
    assert s["makespan_s"] == pytest.approx(5.0)
    assert s["throughput_tokens_s"] == pytest.approx(6 / 5)
    assert s["throughput_requests_s"] == pytest.approx(2 / 5)
    none = bench_serve.summarize_requests(records[2:], "rtc", None)
    assert (none["num_completed"], none["num_failed"], none["mean_jct_s"]) == (0, 1, None)


def test_prompts_have_exactly_the_input_length_and_repeat_with_the_seed():
    trace = [TraceRequest(0.0, 5, 1), TraceRequest(1.0, 17, 2)]
    a, b = bench_serve.make_prompts(trace, 3), bench_serve.make_prompts(trace, 3)
    assert [len(p) for p in a] == [5, 17] and a == b
    assert all(1000 <= t < 30000 for p in a for t in p)
    assert bench_serve.make_prompts(trace, 4) != a


def test_bench_compare_end_to_end(tiny_tok_model, tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(
        json.dumps({"arrival_s": i * 0.05, "input_tokens": 8 + (i * 7) % 40,
                    "output_tokens": 2 + (i * 5) % 12}) + "\n" for i in range(30)))
    out_dir, out = tmp_path / "out", tmp_path / "summaries.json"
    rc = main(["--log-level", "WARNING", "bench", "compare", "--policies", "fcfs,rtc",
               "--trace", str(trace), "--model", str(tiny_tok_model), "--kv-blocks", "256",
               "--out-dir", str(out_dir), "--json", str(out), "--no-progress",
               "--timeout-s", "60"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    summaries = json.loads(out.read_text())
    assert [s["policy"] for s in summaries] == ["fcfs", "rtc"]
    assert [s["scheduler_policy"] for s in summaries] == ["fcfs", "rtc"]
    for s in summaries:
        assert (s["num_requests"], s["num_completed"], s["num_failed"]) == (30, 30, 0)
        assert set(bench_serve.SUMMARY_KEYS) <= set(s)
        assert 0 < s["p50_jct_s"] <= s["p95_jct_s"] <= s["p99_jct_s"]
        assert s["throughput_tokens_s"] > 0
        # Where the run's time went, from the scheduler's counters over this run alone (each
        # run has its own scheduler): every request's every token is an iteration's job.
        p = s["run_profile"]
        kinds = ("prefill", "mixed", "decode", "other")
        assert sum(p[f"{k}_iterations"] for k in kinds) == p["iterations"] >= 13
        computing = p["iterations"] - p["other_iterations"]
        assert computing * p["mean_batch"] >= sum(2 + (i * 5) % 12 for i in range(30))
        assert 1 <= p["mean_batch"] <= 30
        assert 0 < p["compute_s"] < p["span_s"] and p["cpu_worker_s"] > 0
        assert p["other_processes_cores"] >= 0 and p["steal_cores"] >= 0
    assert "decode ms" in printed
    for policy in ("fcfs", "rtc"):
        run = json.loads((out_dir / f"{policy}_ratetrace.json").read_text())
        reqs = run["requests"]
        assert len(reqs) == 30 and all(r["error"] is None for r in reqs)
        # ignore_eos and max_tokens = output_tokens: every request gets exactly its length.
        assert [r["output_tokens"] for r in reqs] == [2 + (i * 5) % 12 for i in range(30)]
        assert all(r["arrival"] <= r["sent"] <= r["first_token"] <= r["finish"] for r in reqs)
    assert "fcfs" in printed and "rtc" in printed and "JCT mean/fcfs" in printed
    png = out_dir / "jct_cdf.png"
    assert png.exists() and png.stat().st_size > 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_bench_compare_runs_at_fractions_of_the_capacity_it_measures(tiny_tok_model,
                                                                     tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(
        json.dumps({"arrival_s": i, "input_tokens": 8, "output_tokens": 60}) + "\n"
        for i in range(24)))
    out_dir, out = tmp_path / "out", tmp_path / "summaries.json"
    # 1,440 iterations of a tiny model, about 2 s here: a request queued a quarter of a second
    # found the batch of one full (the default second is for real models).
    rc = main(["--log-level", "WARNING", "bench", "compare", "--policies", "fcfs",
               "--trace", str(trace), "--model", str(tiny_tok_model), "--kv-blocks", "256",
               "--max-batch-size", "1", "--no-kvstore", "--loads", "0.5",
               "--capacity-min-wait", "0.25", "--out-dir", str(out_dir), "--json", str(out),
               "--no-progress", "--no-plots", "--timeout-s", "120"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    capacity = json.loads((out_dir / "capacity.json").read_text())
    probe = json.loads((out_dir / "fcfs_capacity.json").read_text())
    assert len(probe["requests"]) == 24 and probe["summary"]["num_failed"] == 0
    # Sent at once to a batch of one: the queue was never empty until the last started.
    assert probe["summary"]["saturated_tokens_s"] == capacity["saturated_tokens_s"] > 0
    assert probe["summary"]["capacity_min_wait_s"] == capacity["min_wait_s"] == 0.25
    waited = [r for r in probe["requests"] if r["server_queue_time_s"] >= 0.25]
    assert len(waited) >= 6
    assert capacity["saturated_window_s"] == pytest.approx(
        max(r["arrival"] + r["server_queue_time_s"] for r in waited)
        - min(r["arrival"] for r in waited))
    assert capacity["mean_output_tokens"] == 60
    assert capacity["capacity_req_s"] == pytest.approx(capacity["saturated_tokens_s"] / 60)
    rate = round(0.5 * capacity["capacity_req_s"], 4)
    assert capacity["loads"] == {"0.5": rate}
    [summary] = json.loads(out.read_text())
    assert (summary["rate"], summary["load"], summary["num_failed"]) == (rate, 0.5, 0)
    run = json.loads((out_dir / f"fcfs_rate{rate:g}.json").read_text())
    assert run["config"]["load"] == 0.5
    # Poisson arrivals at half the capacity: the 24 span about 24 / rate seconds.
    arrivals = [r["arrival"] for r in run["requests"]]
    assert 0.4 * 24 / rate < max(arrivals) - min(arrivals) < 2.0 * 24 / rate
    assert f"load 0.5 -> {rate:g} req/s" in printed


def test_loads_are_exclusive_with_rates(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "input_tokens": 4, "output_tokens": 2}\n')
    for extra in (["--rate", "1"], ["--rates", "1,2"]):
        rc = main(["bench", "compare", "--policies", "fcfs", "--trace", str(trace),
                   "--loads", "0.85", *extra])
        assert rc == 2
        assert "--loads sets the rates" in capsys.readouterr().err
    for bad in (["--loads", "0"], ["--loads", "0.85", "--capacity-min-wait", "-1"]):
        with pytest.raises(SystemExit):
            main(["bench", "compare", "--policies", "fcfs", "--trace", str(trace), *bad])
        assert "expected positive numbers" in capsys.readouterr().err


def test_bench_serve_reports_an_unreachable_scheduler(tmp_path, capsys):
    trace = tmp_path / "t.jsonl"
    trace.write_text('{"arrival_s": 0, "input_tokens": 4, "output_tokens": 2}\n')
    port = free_port()
    bench_serve.STATUS_TIMEOUT_S, old = 2.0, bench_serve.STATUS_TIMEOUT_S
    try:
        rc = main(["bench", "serve", "--trace", str(trace), "--address", f"127.0.0.1:{port}",
                   "--no-progress"])
    finally:
        bench_serve.STATUS_TIMEOUT_S = old
    assert rc == 1
    assert "cannot reach the scheduler" in capsys.readouterr().err


def test_capacity_counts_the_tokens_made_while_requests_queued_not_the_drain():
    from fastserve.bench.capacity import saturated_throughput, tokens_made

    def rec(arrival, queued, first, finish, n):
        return {"arrival": arrival, "server_queue_time_s": queued, "first_token": first,
                "finish": finish, "input_tokens": 4, "output_tokens": n, "error": None}

    # Two requests decode 0-10 s at 10 tokens/s each; a third waits 2-6 s, then decodes
    # 6-10 s; the first's tail 10-20 s is the drain.
    records = [rec(0.0, 0.0, 0.0, 20.0, 201), rec(0.0, 0.0, 0.0, 10.0, 101),
               rec(2.0, 4.0, 6.0, 10.0, 41),
               rec(1.0, None, None, None, 0) | {"error": "CANCELLED"}]
    assert tokens_made(records[0], 2.0, 6.0) == pytest.approx(40.0)
    assert tokens_made(records[2], 2.0, 6.0) == 0.0          # its first token is at the end
    assert tokens_made(records[2], 2.0, 6.1) == pytest.approx(1.0 + 0.1 / 4 * 40)
    s = saturated_throughput(records)
    assert s["saturated_window_s"] == pytest.approx(4.0)
    assert s["saturated_tokens_s"] == pytest.approx(20.0)     # 10 + 10 tokens/s, 2-6 s
    assert saturated_throughput(records, min_wait_s=5.0)["saturated_tokens_s"] is None
    summary = bench_serve.summarize_requests(records, "fcfs", 1.0)
    assert summary["throughput_tokens_s"] == pytest.approx(343 / 20)  # the drain included


def test_capacity_of_a_recorded_run_above_capacity_is_above_its_throughput():
    import pathlib

    path = pathlib.Path(__file__).parents[2] / "docs/bench-predictive/capacity/fcfs_rate2.json"
    result = json.loads(path.read_text())
    s = bench_serve.bench_summary({"policy": "fcfs", "requests": result["requests"]}, 2.0)
    assert s["saturated_tokens_s"] > 1.04 * s["throughput_tokens_s"]
    assert s["saturated_window_s"] < s["makespan_s"]
