"""Streaming generation through real processes and real gRPC, with the default model."""

from __future__ import annotations

import threading

import pytest
import torch

from fastserve.proto import scheduler_pb2 as spb

pytestmark = pytest.mark.slow

WORDS = ["river", "mountain", "quiet", "engine", "yellow", "history", "garden", "orbit",
         "signal", "paper", "violin", "harbor", "copper", "meadow", "lantern"]


def _prompts(n):
    out = []
    for i in range(n):
        k = 1 + (i * 7) % 60  # 1 to 60 words: mixed lengths
        body = " ".join(WORDS[(i + j) % len(WORDS)] for j in range(k))
        out.append(f"Request {i}: continue this list: {body}")
    return out


def collect(stream):
    text, ids, final = "", [], None
    for msg in stream:
        if msg.HasField("chunk"):
            text += msg.chunk.text
            ids += list(msg.chunk.token_ids)
        else:
            final = msg.final
    return text, ids, final


def greedy(prompt, max_tokens, **kw):
    return spb.GenerateRequest(
        text=prompt, sampling=spb.SamplingOptions(max_tokens=max_tokens, temperature=0.0, **kw)
    )


def test_capital_of_france_names_paris(smol_cluster):
    req = spb.GenerateRequest(
        chat=spb.ChatMessages(messages=[spb.ChatMessage(role="user",
                                                        content="What is the capital of France?")]),
        sampling=spb.SamplingOptions(max_tokens=30, temperature=0.0),
    )
    text, _, final = collect(smol_cluster.stub.Generate(req))
    assert "Paris" in text and final.finish_reason == spb.FINISH_REASON_STOP


def test_32_concurrent_streams_match_transformers(smol_cluster, default_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    hf = AutoModelForCausalLM.from_pretrained(default_model_dir, dtype=torch.float32).eval()
    prompts = _prompts(32)
    max_tokens = [8 + (i * 5) % 25 for i in range(32)]
    results = [None] * 32

    def run(i):
        results[i] = collect(smol_cluster.stub.Generate(greedy(prompts[i], max_tokens[i])))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    for i, p in enumerate(prompts):
        ids = tok(p, return_tensors="pt").input_ids
        with torch.inference_mode():
            out = hf.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                              max_new_tokens=max_tokens[i], pad_token_id=tok.pad_token_id)
        ref_ids = out[0, ids.shape[1]:].tolist()
        text, got_ids, final = results[i]
        assert got_ids == ref_ids, f"request {i}: {got_ids} != {ref_ids}"
        assert text == tok.decode(ref_ids, skip_special_tokens=True)
        assert final.usage.completion_tokens == len(ref_ids)
        assert final.usage.prompt_tokens == ids.shape[1]
    status = smol_cluster.stub.Status(spb.StatusRequest())
    assert status.num_running == 0 and status.num_waiting == 0
    assert [w.num_used_blocks for w in status.workers] == [0]


def test_stop_string_spanning_tokens_is_not_returned(smol_cluster):
    full, _, _ = collect(smol_cluster.stub.Generate(greedy(_prompts(3)[2], 24, ignore_eos=True)))
    stop = full[5:12]
    assert len(stop.strip()) >= 3
    text, _, final = collect(smol_cluster.stub.Generate(
        greedy(_prompts(3)[2], 24, ignore_eos=True, stop=[stop])))
    assert text == full[: full.index(stop)]
    assert final.finish_reason == spb.FINISH_REASON_STOP and final.stop_string == stop


def test_min_tokens_holds_the_end_of_sequence_back(smol_cluster):
    chat = spb.ChatMessages(messages=[spb.ChatMessage(role="user",
                                                      content="What is the capital of France?")])
    _, base, final = collect(smol_cluster.stub.Generate(spb.GenerateRequest(
        chat=chat, sampling=spb.SamplingOptions(max_tokens=40, temperature=0.0))))
    assert final.finish_reason == spb.FINISH_REASON_STOP and len(base) < 30
    _, ids, final = collect(smol_cluster.stub.Generate(spb.GenerateRequest(
        chat=chat, sampling=spb.SamplingOptions(max_tokens=40, temperature=0.0,
                                                min_tokens=30))))
    assert final.usage.completion_tokens >= 30
    k = len(base) - 1  # the same greedy tokens up to where the first run's eos came
    assert ids[:k] == base[:k]
