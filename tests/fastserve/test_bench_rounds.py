"""`bench compare --rounds`: the order of the runs, and each run measured against the
reference's runs around it (interpolated in time), on figures with a known drift."""

from __future__ import annotations

import json

import pytest

from fastserve.bench import rounds
from fastserve.cli import main


def test_the_first_run_brackets_every_round():
    assert rounds.schedule(["fcfs", "mlfq"], ["reactive"], 1) == [
        (None, "fcfs", "reactive"), (None, "mlfq", "reactive")]
    assert rounds.schedule(["fcfs", "mlfq"], [None], 2) == [
        (1, "fcfs", None), (1, "mlfq", None), (2, "fcfs", None), (2, "mlfq", None),
        (3, "fcfs", None)]


def test_at_time_is_linear_between_points_and_flat_beyond():
    pts = [(10.0, 80.0), (0.0, 100.0)]
    assert rounds.at_time(pts, 5.0) == pytest.approx(90.0)
    assert rounds.at_time(pts, -3.0) == 100.0 and rounds.at_time(pts, 12.0) == 80.0
    with pytest.raises(ValueError):
        rounds.at_time([], 1.0)


def _run(policy, start, wall, tok_s, jct, rate=1.0):
    return {"policy": policy, "rate": rate, "started_at": start, "wall_s": wall,
            "throughput_tokens_s": tok_s, "mean_jct_s": jct}


def test_a_drifting_machine_moves_the_reference_with_it():
    # The machine slows by 20% over the comparison; the policy keeps pace with FCFS in the
    # first round and makes 10% more in the second. Against the first FCFS run alone the
    # second round would read 0.94x, a loss.
    runs = [_run("fcfs", 0, 10, 100.0, 10.0), _run("mlfq", 10, 10, 95.0, 10.5),
            _run("fcfs", 20, 10, 90.0, 11.0), _run("mlfq", 30, 10, 0.85 * 110, 11.5),
            _run("fcfs", 40, 10, 80.0, 12.0), _run("mlfq", 0, 1, 50.0, 1.0, rate=2.0)]
    [row, other_rate] = rounds.bracketed(runs, "fcfs")
    assert (row["policy"], row["rate"], row["num_reference_runs"]) == ("mlfq", 1.0, 3)
    assert row["ratios"]["throughput_tokens_s"] == pytest.approx([1.0, 1.1])
    assert row["ratios"]["mean_jct_s"] == pytest.approx([1.0, 1.0])
    # No reference run at that rate: no ratio rather than one against another rate's run.
    assert other_rate["ratios"]["throughput_tokens_s"] == [None]
    table = rounds.format_bracketed([row, other_rate])
    assert "1.00 1.10" in table and "1.00x" in table and f"{(1.1) ** 0.5:.2f}x" in table


def test_bench_compare_rounds_end_to_end(tiny_tok_model, tmp_path, capsys):
    trace = tmp_path / "trace.jsonl"
    trace.write_text("".join(
        json.dumps({"arrival_s": i * 0.05, "input_tokens": 8 + i, "output_tokens": 3 + i % 4})
        + "\n" for i in range(8)))
    out_dir = tmp_path / "out"
    rc = main(["--log-level", "WARNING", "bench", "compare", "--policies", "fcfs,rtc",
               "--rounds", "2", "--trace", str(trace), "--model", str(tiny_tok_model),
               "--kv-blocks", "128", "--no-kvstore", "--out-dir", str(out_dir), "--no-plots",
               "--no-progress", "--timeout-s", "60"])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    summaries = json.loads((out_dir / "summaries.json").read_text())
    assert [(s["policy"], s["round"]) for s in summaries] == [
        ("fcfs", 1), ("rtc", 1), ("fcfs", 2), ("rtc", 2), ("fcfs", 3)]
    assert all(s["num_completed"] == 8 for s in summaries)
    starts = [s["started_at"] for s in summaries]
    assert starts == sorted(starts)
    for rnd in (1, 2):
        assert (out_dir / f"rtc_ratetrace_r{rnd}.json").exists()
    [row] = json.loads((out_dir / "rounds.json").read_text())
    assert (row["policy"], row["num_reference_runs"]) == ("rtc", 3)
    assert all(r > 0 for r in row["ratios"]["throughput_tokens_s"])
    assert "rtc #2" in printed and "against fcfs's runs before and after each" in printed
