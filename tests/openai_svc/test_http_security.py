"""The gRPC API's keys and TLS apply to the HTTP API too (issue 16): the front end passes the
caller's bearer token on, serves HTTPS, and reaches a TLS scheduler."""

from __future__ import annotations

import ssl

import httpx
import pytest
from procs import start_http, start_scheduler, start_worker

from fastserve.tls import CA_FILE, cert_files, make_local_ca

openai = pytest.importorskip("openai")

KEY = "alice-key-0123456789"


def test_api_keys_and_tls(chat_model, tmp_path):
    d = make_local_ca(tmp_path / "tls", ("scheduler", "worker", "http"))
    keys = tmp_path / "keys"
    keys.write_text(f"{KEY}\n")

    def tls(name):
        cert, key = cert_files(d, name)
        return ["--tls-cert", cert, "--tls-key", key]

    worker = start_worker(str(chat_model), tmp_path, 128, "worker", *tls("worker"),
                          "--tls-ca", str(d / CA_FILE))
    scheduler = http = None
    try:
        scheduler = start_scheduler(str(chat_model), [worker.address], tmp_path,
                                    "--api-keys", str(keys), *tls("scheduler"),
                                    "--tls-ca", str(d / CA_FILE))
        http = start_http(scheduler.address, tmp_path, "--tls-ca", str(d / CA_FILE),
                          *tls("http"))
        base = f"https://{http.address}/v1"
        ca = ssl.create_default_context(cafile=str(d / CA_FILE))
        with pytest.raises(httpx.TransportError):  # HTTPS only: a plain client gets nowhere
            httpx.get(f"http://{http.address}/v1/models", timeout=5).raise_for_status()
        for key in ("", "wrong-key-0123456789"):
            client = openai.OpenAI(base_url=base, api_key=key or "x", max_retries=0,
                                   http_client=httpx.Client(verify=ca))
            with pytest.raises(openai.AuthenticationError) as e:
                client.models.list()
            assert "API key" in e.value.body["message"]
        ok = openai.OpenAI(base_url=base, api_key=KEY, max_retries=0,
                           http_client=httpx.Client(verify=ca))
        model = ok.models.list().data[0].id
        r = ok.completions.create(model=model, prompt="hi", max_tokens=3, temperature=0.0,
                                  extra_body={"ignore_eos": True})
        assert r.usage.completion_tokens == 3
    finally:
        for p in (http, scheduler, worker):
            if p is not None:
                p.stop()
