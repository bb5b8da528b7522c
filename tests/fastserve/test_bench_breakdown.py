"""`fastserve bench breakdown` end to end on real processes and a tiny random-weight model."""

from __future__ import annotations

import json

from fastserve.cli import main


def test_breakdown_accounts_for_every_iteration_and_process(tiny_tok_model, tmp_path, capsys):
    out = tmp_path / "breakdown.json"
    rc = main(["--log-level", "WARNING", "bench", "breakdown", "--model", str(tiny_tok_model),
               "--kv-blocks", "128", "--concurrency", "1,3", "--input-tokens", "24",
               "--output-tokens", "6", "--json", str(out)])
    printed = capsys.readouterr().out
    assert rc == 0, printed
    rows = json.loads(out.read_text())["rows"]
    assert [r["concurrency"] for r in rows] == [1, 3]
    for r in rows:
        assert r["num_failed"] == 0
        kinds = (r["prefill_iterations"] + r["mixed_iterations"] + r["decode_iterations"]
                 + r["other_iterations"])
        assert kinds == r["iterations"] > 0
        by_kind = (r["prefill_compute_s"] + r["mixed_compute_s"] + r["decode_compute_s"]
                   + r["other_compute_s"])
        assert abs(by_kind - r["compute_s"]) < 1e-6 and r["compute_s"] > 0
        assert 0 < r["mean_ttft_s"] <= r["mean_jct_s"] <= r["span_s"]
        assert r["compute_s"] + r["outside_compute_s"] <= r["span_s"] + 0.05
        assert {"cpu_worker_s", "cpu_scheduler_s", "cpu_kvstore_s", "cpu_client_s"} <= set(r)
        assert r["threads"]["worker"] > 0
    # one request alone: one prefill, then a decode-only iteration per further token
    assert rows[0]["prefill_iterations"] == 1 and rows[0]["decode_iterations"] == 5
    assert "-- 3 requests at once" in printed
