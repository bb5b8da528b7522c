"""The OpenAI HTTP API against real processes (issue 16): the official ``openai`` client, curl
with an SSE parser, every bad input of the gRPC tests, and a disconnect that frees blocks."""

from __future__ import annotations

import json
import shutil
import subprocess
import time

import httpx
import pytest

from fastserve.client import Client

openai = pytest.importorskip("openai")

MESSAGES = [{"role": "user", "content": "Name three colours."}]


@pytest.fixture(scope="module")
def oai(cluster):
    _, base, _ = cluster
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def model(cluster):
    return str(cluster[2])


@pytest.fixture(scope="module")
def sdk(cluster):
    with Client(cluster[0]) as c:
        yield c


def test_models_health_and_metrics(cluster, oai, model):
    _, base, _ = cluster
    assert [m.id for m in oai.models.list().data] == [model]
    assert httpx.get(f"{base}/health").json() == {"status": "ok"}
    assert "fastserve_http_requests_total" in httpx.get(f"{base}/metrics").text


def test_chat_matches_the_grpc_sdk_greedy_token_for_token(oai, sdk, model):
    want = sdk.generate(messages=MESSAGES, max_tokens=12, temperature=0.0, ignore_eos=True)
    got = oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=12,
                                      temperature=0.0, extra_body={"ignore_eos": True})
    assert got.choices[0].message.content == want.text
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].finish_reason == "length"
    assert got.usage.completion_tokens == 12
    assert got.usage.prompt_tokens == want.usage.prompt_tokens
    assert got.usage.total_tokens == got.usage.prompt_tokens + 12
    assert got.id.startswith("chatcmpl-") and got.object == "chat.completion"


def test_chat_streaming_with_usage(oai, sdk, model):
    want = sdk.generate(messages=MESSAGES, max_tokens=10, temperature=0.0, ignore_eos=True)
    chunks = list(oai.chat.completions.create(
        model=model, messages=MESSAGES, max_completion_tokens=10, temperature=0.0,
        stream=True, stream_options={"include_usage": True}, extra_body={"ignore_eos": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 10
    assert all(c.usage is None for c in chunks[:-1])


@pytest.mark.parametrize("prompt", ["Once upon a time", [1, 2, 3, 4, 5]])
def test_completions_streamed_and_not_match_the_sdk(oai, sdk, model, prompt):
    want = sdk.generate(prompt, max_tokens=9, temperature=0.0, ignore_eos=True)
    whole = oai.completions.create(model=model, prompt=prompt, max_tokens=9, temperature=0.0,
                                   extra_body={"ignore_eos": True})
    assert whole.choices[0].text == want.text
    assert whole.usage.completion_tokens == 9
    assert whole.usage.prompt_tokens == want.usage.prompt_tokens
    streamed = list(oai.completions.create(model=model, prompt=prompt, max_tokens=9,
                                           temperature=0.0, stream=True,
                                           extra_body={"ignore_eos": True}))
    assert "".join(c.choices[0].text for c in streamed if c.choices) == want.text
    assert streamed[-1].choices[0].finish_reason == "length"


def test_logprobs_are_the_sampled_tokens(oai, sdk, model):
    want = sdk.generate("Hello", max_tokens=4, temperature=0.0, ignore_eos=True)
    r = oai.completions.create(model=model, prompt="Hello", max_tokens=4, temperature=0.0,
                               logprobs=0, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert "".join(lp.tokens) == want.text and len(lp.token_logprobs) == 4
    assert all(x <= 0 for x in lp.token_logprobs)
    c = oai.chat.completions.create(model=model, messages=MESSAGES, max_tokens=4,
                                    temperature=0.0, logprobs=True,
                                    extra_body={"ignore_eos": True})
    assert len(c.choices[0].logprobs.content) == 4


def sse_events(text: str) -> list:
    events = []
    for block in text.split("\n\n"):
        for line in block.splitlines():
            if line.startswith("data: "):
                data = line[len("data: "):]
                events.append(data if data == "[DONE]" else json.loads(data))
    return events


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl not installed")
def test_curl_and_an_sse_parser(cluster, sdk, model):
    _, base, _ = cluster
    body = {"model": model, "prompt": "The sea", "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}}
    out = subprocess.run(["curl", "-sN", "-H", "Content-Type: application/json", "-d",
                          json.dumps(body), f"{base}/v1/completions"], capture_output=True,
                         text=True, timeout=60, check=True).stdout
    events = sse_events(out)
    assert events[-1] == "[DONE]"
    assert events[-2]["usage"]["completion_tokens"] == 6
    text = "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])
    assert text == sdk.generate("The sea", max_tokens=6, temperature=0.0, ignore_eos=True).text
    bad = subprocess.run(["curl", "-s", "-w", "\n%{http_code}", "-H",
                          "Content-Type: application/json", "-d", '{"model": "x"',
                          f"{base}/v1/completions"], capture_output=True, text=True,
                         timeout=30, check=True).stdout
    payload, code = bad.rsplit("\n", 1)
    assert code == "400" and "not valid JSON" in json.loads(payload)["error"]["message"]


# (body overrides, the param the error must name, words of its message)
BAD = [
    ({"temperature": -1.0}, "temperature", "[0, 100]"),
    ({"temperature": "hot"}, "temperature", "valid number"),
    ({"top_p": 0.0}, "top_p", "(0, 1]"),
    ({"top_k": -3}, "top_k", "must be in [0,"),
    ({"max_tokens": 0}, "max_tokens", "must be in [1"),
    ({"max_tokens": 10**6}, "max_tokens", "must be in [1"),
    ({"stop": [""]}, "stop", "empty"),
    ({"stop": ["s"] * 17}, "stop", "at most 16"),
    ({"prompt": ""}, "prompt", "must not be empty"),
    ({"prompt": []}, "prompt", "must not be empty"),
    ({"prompt": [10**9]}, "prompt", "outside [0,"),
    ({"prompt": [1] * 3000}, "prompt", "limit"),
    ({"prompt": "x" * 70_000}, "prompt", "bytes"),
    ({"prompt": ["a", "b"]}, "prompt", "one per request"),
    ({"n": 3}, "n", "only 1"),
    ({"presence_penalty": 0.5}, "presence_penalty", "only 0.0"),
    ({"logit_bias": {"5": 1.0}}, "logit_bias", "not supported"),
    ({"logprobs": 5}, "logprobs", "at most 0"),
    ({"echo": True}, "echo", "not supported"),
    ({"seed": -1}, "seed", ">= 0"),
    ({"request_id": "r" * 300}, "request_id", "limit is 256"),
    ({"min_tokens": 5}, "min_tokens", "[0, max_tokens=4]"),
]


@pytest.mark.parametrize("overrides,param,words", BAD,
                         ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD)])
def test_bad_completion_input_is_400_naming_the_field(cluster, model, overrides, param, words):
    _, base, _ = cluster
    body = {"model": model, "prompt": "hi", "max_tokens": 4, **overrides}
    r = httpx.post(f"{base}/v1/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error"
    assert err["param"] == param, err
    assert words in err["message"], err


BAD_CHAT = [
    ({"messages": []}, "messages", "at least 1"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages", "robot"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0].content",
     "only text parts"),
    ({"messages": [{"role": "user"}] * 1025}, "messages", "limit is 1024"),
    ({"top_logprobs": 3}, "top_logprobs", "only 0"),
    ({"max_completion_tokens": -1}, "max_tokens", "must be in [1"),
]


@pytest.mark.parametrize("overrides,param,words", BAD_CHAT,
                         ids=[f"{p}-{i}" for i, (_, p, _) in enumerate(BAD_CHAT)])
def test_bad_chat_input_is_400_naming_the_field(cluster, model, overrides, param, words):
    _, base, _ = cluster
    body = {"model": model, "messages": MESSAGES, "max_tokens": 4, **overrides}
    r = httpx.post(f"{base}/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param, err
    assert words in err["message"], err


def test_unknown_model_route_and_oversized_body(cluster, oai):
    _, base, _ = cluster
    with pytest.raises(openai.NotFoundError) as e:
        oai.completions.create(model="not-this-one", prompt="hi", max_tokens=2)
    assert e.value.body["code"] == "model_not_found"
    assert httpx.get(f"{base}/v2/nothing").status_code == 404
    big = httpx.post(f"{base}/v1/completions", content=b"x" * (5 << 20),
                     headers={"content-type": "application/json"}, timeout=30)
    assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"


def _idle(sdk, timeout_s=10.0):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        st = sdk.status()
        if st["num_running"] == 0 and st["num_waiting"] == 0 and \
                st["workers"][0]["num_used_blocks"] == 0:
            return st
        time.sleep(0.05)
    raise AssertionError(f"not idle: {sdk.status()}")


def test_a_disconnect_mid_stream_frees_the_jobs_blocks(cluster, sdk, model):
    _, base, _ = cluster
    body = {"model": model, "prompt": "A long story", "max_tokens": 1500, "temperature": 0,
            "ignore_eos": True, "stream": True}
    with httpx.Client(timeout=30) as http, \
            http.stream("POST", f"{base}/v1/completions", json=body) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        got = [next(lines) for _ in range(4)]
        assert any(x.startswith("data: ") for x in got)
        running = sdk.status()
        assert running["num_running"] == 1 and running["workers"][0]["num_used_blocks"] > 0
    start = time.monotonic()
    _idle(sdk)
    assert time.monotonic() - start < 5.0
    # Non-streamed too: the client gives up before the answer.
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{base}/v1/completions", json={**body, "stream": False}, timeout=1.0)
    _idle(sdk)


def test_the_service_is_unharmed_after_bad_input(oai, sdk, model):
    _idle(sdk)
    r = oai.completions.create(model=model, prompt="still fine", max_tokens=3,
                               temperature=0.0, extra_body={"ignore_eos": True})
    assert r.usage.completion_tokens == 3
