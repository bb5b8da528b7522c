"""Admission and availability over HTTP (issue 16): a full waiting queue is 429, no worker is
503 on /health and on requests, each in OpenAI's error shape."""

from __future__ import annotations

import time

import httpx
from procs import start_http, start_scheduler, start_worker


def test_a_full_queue_is_429_and_no_worker_is_503(chat_model, tmp_path):
    worker = start_worker(str(chat_model), tmp_path, 128)
    scheduler = start_scheduler(str(chat_model), [worker.address], tmp_path,
                                "--max-waiting", "0", "--worker-loss-wait-s", "1")
    http = start_http(scheduler.address, tmp_path)
    base = f"http://{http.address}"
    try:
        body = {"model": str(chat_model), "prompt": "hi", "max_tokens": 2}
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=30)
        assert r.status_code == 429, r.text
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert "waiting queue is full" in r.json()["error"]["message"]
        assert httpx.get(f"{base}/health", timeout=10).status_code == 200
        worker.kill()
        deadline = time.monotonic() + 20
        while httpx.get(f"{base}/health", timeout=10).status_code != 503:
            assert time.monotonic() < deadline, "health still 200 without a worker"
            time.sleep(0.2)
        r = httpx.post(f"{base}/v1/completions", json=body, timeout=30)
        assert r.status_code == 503 and r.json()["error"]["type"] == "service_unavailable"
    finally:
        http.stop()
        scheduler.stop()
        worker.stop()
