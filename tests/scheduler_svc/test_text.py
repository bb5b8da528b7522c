"""Text handling: chat rendering, stop validation and streaming detokenization.

Everything but ``validate_stop`` uses the default model's tokenizer (SmolLM2, byte-level BPE).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_svc.api.text import (
    ALLOWED_ROLES,
    IncrementalDetokenizer,
    InvalidRequest,
    TextModel,
    validate_stop,
)

FUNNY = [
    *"😀🎉👍🏽👩‍👩‍👧中文字한국어日本語éèüñçÅ\u0301ß€ \n\t",
    "  ",
    "\n\n",
    "hello",
    " world",
]
TEXT = st.lists(st.one_of(st.characters(codec="utf-8"), st.sampled_from(FUNNY)), max_size=30).map(
    "".join
)
PROMPTS = ["", "Once upon a time", "Emoji at the end 😀", "<|im_start|>assistant\n"]


@pytest.fixture(scope="module")
def tm() -> TextModel:
    from fastserve.models import DEFAULT_MODEL, resolve_model

    return TextModel.load(resolve_model(DEFAULT_MODEL))


def chunk(ids: list[int], sizes: list[int]) -> list[list[int]]:
    """Split ``ids`` into groups of the given sizes, cycling through them."""
    out, i, k = [], 0, 0
    while i < len(ids):
        n = sizes[k % len(sizes)] if sizes else 1
        out.append(ids[i : i + n])
        i, k = i + n, k + 1
    return out


def stream(tm, ids, sizes=(1,), stop=(), prompt="", skip_special_tokens=True):
    """Feed ``ids`` in groups; return (deltas from add, finish text, detokenizer)."""
    detok = IncrementalDetokenizer(tm, tm.encode(prompt), stop, skip_special_tokens)
    deltas = [detok.add(group).text for group in chunk(list(ids), list(sizes))]
    return deltas, detok.finish(), detok


def expected_with_stops(full: str, stops: list[str]) -> str:
    """The reference rule: cut before the occurrence that ends first (tie: the longest)."""
    hits = [(full.find(s) + len(s), full.find(s)) for s in stops if s in full]
    return full[: min(hits)[1]] if hits else full


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(text=TEXT, sizes=st.lists(st.integers(1, 4), max_size=5), prompt=st.sampled_from(PROMPTS))
def test_stream_matches_full_decode(tm, text, sizes, prompt):
    ids = tm.encode(text)
    full = tm.tokenizer.decode(ids, skip_special_tokens=True)
    deltas, tail, detok = stream(tm, ids, sizes, prompt=prompt)
    assert "".join(deltas) + tail == full
    assert detok.text == full
    if "\ufffd" not in full:
        assert not any("\ufffd" in d for d in deltas)


@pytest.mark.slow
@settings(max_examples=100, deadline=None)
@given(
    ids=st.lists(st.integers(0, 49151), max_size=30),
    sizes=st.lists(st.integers(1, 3)),
    skip=st.booleans(),
)
def test_stream_matches_decode_of_arbitrary_ids(tm, ids, sizes, skip):
    # Random ids give invalid UTF-8 and special tokens mid-stream.
    full = tm.tokenizer.decode(ids, skip_special_tokens=skip)
    deltas, tail, _ = stream(tm, ids, sizes, skip_special_tokens=skip)
    assert "".join(deltas) + tail == full
    if "\ufffd" not in full:
        assert not any("\ufffd" in d for d in deltas)


@pytest.mark.slow
@settings(max_examples=60, deadline=None)
@given(text=TEXT, data=st.data(), sizes=st.lists(st.integers(1, 3), max_size=4))
def test_stream_with_stops_matches_reference(tm, text, data, sizes):
    ids = tm.encode(text)
    full = tm.decode(ids)
    # Draw stop strings mostly from the text itself so that they hit.
    substr = st.integers(0, len(full)).flatmap(
        lambda i: st.integers(i + 1, i + 6).map(lambda j: full[i:j])
    )
    stops = data.draw(st.lists(st.one_of(substr, TEXT).filter(bool), max_size=3))
    deltas, tail, detok = stream(tm, ids, sizes, stop=stops)
    assert "".join(deltas) + tail == expected_with_stops(full, stops)
    assert (detok.stop_string is not None) == any(s in full for s in stops)


@pytest.mark.slow
def test_stop_spanning_tokens_is_caught_when_it_completes(tm):
    text = "The answer is 42. Supercalifragilistic and more"
    stop = "Supercalifragilistic"
    ids = tm.encode(text)
    # The first token count whose decode contains the whole stop string.
    done = next(n for n in range(len(ids) + 1) if stop in tm.decode(ids[:n]))
    assert len(tm.encode(stop)) > 2
    detok = IncrementalDetokenizer(tm, [], [stop])
    deltas = [detok.add([t]) for t in ids]
    assert [d.stopped for d in deltas].index(True) == done - 1
    assert "".join(d.text for d in deltas) == "The answer is 42. "
    assert deltas[-1] == deltas[done] and deltas[done].text == ""
    assert detok.finish() == "" and detok.stop_string == stop


@pytest.mark.parametrize("chunk", [1, 100])
def test_a_stop_string_before_min_tokens_does_not_end_the_output(tm, chunk):
    ids = tm.encode("STOP here, then STOP again")
    first_after = next(n for n in range(1, len(ids)) if "STOP" in tm.decode(ids[3:n]))
    detok = IncrementalDetokenizer(tm, [], ["STOP"], min_tokens=3)
    text = "".join(detok.add(ids[i:i + chunk]).text for i in range(0, len(ids), chunk))
    # The first STOP lies in the first two tokens: emitted; the second ends the output.
    assert detok.stop_string == "STOP"
    assert text == tm.decode(ids)[: tm.decode(ids).index("STOP", 1)]
    assert first_after > 3


@pytest.mark.slow
def test_partial_match_is_held_then_released(tm):
    detok = IncrementalDetokenizer(tm, [], ["STOP"])
    assert detok.add(tm.encode("Hello")).text == "Hello"
    assert detok.add(tm.encode(" ST")).text == " "  # "ST" could start "STOP"
    assert detok.add(tm.encode("ART")).text == "START"
    assert detok.add(tm.encode(" S")).text == " "
    assert detok.finish() == "S"  # it ended before completing a stop string
    assert detok.text == "Hello START S" and detok.stop_string is None


@pytest.mark.slow
def test_stop_at_the_very_start(tm):
    deltas, tail, detok = stream(tm, tm.encode("STOP and then some"), stop=["STOP"])
    assert "".join(deltas) + tail == ""
    assert detok.stop_string == "STOP"


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [(1,), (100,)])
def test_earliest_stop_wins(tm, sizes):
    ids = tm.encode("alpha beta gamma delta")
    deltas, tail, detok = stream(tm, ids, sizes, stop=["delta", "gamma", "beta"])
    assert "".join(deltas) + tail == "alpha "
    assert detok.stop_string == "beta"


@pytest.mark.slow
@pytest.mark.parametrize("sizes", [(1,), (100,)])
def test_stop_that_ends_first_wins_however_tokens_arrive(tm, sizes):
    # "the end" starts first but "he" is complete first; streaming must not depend on grouping.
    deltas, tail, detok = stream(tm, tm.encode("in the end"), sizes, stop=["the end", "he"])
    assert "".join(deltas) + tail == "in t"
    assert detok.stop_string == "he"


@pytest.mark.slow
def test_prompt_ending_mid_character(tm):
    emoji = tm.encode("😀")
    prompt, output = emoji[:-1], emoji[-1:] + tm.encode(" hi")
    detok = IncrementalDetokenizer(tm, tm.encode("x") + prompt)
    text = "".join(detok.add([t]).text for t in output) + detok.finish()
    assert text == tm.decode(output) == "\ufffd hi"


@pytest.mark.slow
def test_decoding_cost_does_not_grow_with_length(tm, monkeypatch):
    lengths = []
    decode = tm.decode
    monkeypatch.setattr(
        tm, "decode", lambda ids, **kw: lengths.append(len(ids)) or decode(ids, **kw)
    )
    ids = tm.encode("Streaming 😀 text, 中文 and more words. " * 40)
    deltas, tail, _ = stream(tm, ids, prompt="A prompt")
    assert "".join(deltas) + tail == decode(ids)
    assert len(ids) > 400 and max(lengths) <= 8


@pytest.mark.slow
def test_multibyte_stop_and_held_back_character(tm):
    ids = tm.encode("abc 😀 def")
    assert len(ids) > len(tm.encode("abc def"))  # the emoji spans several byte tokens
    deltas, tail, detok = stream(tm, ids, stop=["😀"])
    assert deltas[-1] == "" and "".join(deltas) + tail == "abc "
    assert detok.stop_string == "😀"


@pytest.mark.slow
def test_special_tokens_are_skipped_unless_asked(tm):
    ids = [*tm.encode("Hi there"), 2]
    assert "".join(stream(tm, ids)[0]) == "Hi there"
    deltas, tail, _ = stream(tm, ids, skip_special_tokens=False)
    assert "".join(deltas) + tail == "Hi there<|im_end|>"


@pytest.mark.slow
def test_model_facts(tm):
    assert tm.vocab_size == 49152
    assert tm.eos_token_ids == {2}
    assert tm.encode("hello world") == tm.tokenizer("hello world").input_ids
    assert tm.decode(tm.encode("hello . I 'm")) == "hello . I 'm"  # no space cleanup
    # The vocabulary lacks a few byte tokens (0x04, 0xF1, ...): those bytes encode as the
    # unk token <|endoftext|> (id 0), so such text does not round-trip.
    assert tm.encode("a\x04b") == [*tm.encode("a"), 0, *tm.encode("b")]
    assert tm.decode(tm.encode("\U00040000")) == "\ufffd" * 3


@pytest.mark.slow
def test_render_chat_matches_template(tm):
    messages = [("system", "Be brief."), ("user", "Hi"), ("assistant", "Hello!"), ("user", "2+2?")]
    want = tm.tokenizer.apply_chat_template(
        [{"role": r, "content": c} for r, c in messages], add_generation_prompt=True, tokenize=True
    )
    assert tm.render_chat(messages) == want
    assert (
        tm.render_chat(messages, add_generation_prompt=False)
        == want[: -len(tm.encode("<|im_start|>assistant\n"))]
    )


@pytest.mark.slow
def test_render_chat_rejects_bad_input(tm, monkeypatch):
    with pytest.raises(InvalidRequest) as e:
        tm.render_chat([("user", "hi"), ("wizard", "abracadabra")])
    assert e.value.field == "chat.messages[1].role"
    assert str(e.value) == (
        "chat.messages[1].role: 'wizard' is not one of " + ", ".join(ALLOWED_ROLES)
    )
    with pytest.raises(InvalidRequest) as e:
        tm.render_chat([])
    assert str(e.value) == "chat.messages: at least one message is required"
    assert e.value.field == "chat.messages"
    monkeypatch.setattr(tm.tokenizer, "chat_template", None)
    with pytest.raises(InvalidRequest, match="no chat template"):
        tm.render_chat([("user", "hi")])


def test_invalid_request_names_the_field_once():
    assert str(InvalidRequest("sampling.top_p", "must be in (0, 1]")) == (
        "sampling.top_p: must be in (0, 1]"
    )
    assert str(InvalidRequest("prompt", "prompt: is empty")) == "prompt: is empty"


def test_validate_stop_limits():
    validate_stop([])
    validate_stop(["x" * 256] * 16)
    with pytest.raises(InvalidRequest, match="17 stop strings given, at most 16") as e:
        validate_stop(["a"] * 17)
    assert e.value.field == "sampling.stop"
    with pytest.raises(InvalidRequest, match="entry 1 is empty"):
        validate_stop(["a", ""])
    with pytest.raises(InvalidRequest, match="entry 0 is 257 characters long, at most 256"):
        validate_stop(["x" * 257])
    with pytest.raises(InvalidRequest, match="at most 2 allowed"):
        validate_stop(["a", "b", "c"], max_stops=2)
