"""Turn a GenerateRequest into a scheduler Job: tokenize, render chat, validate every field.

Every rejection is an InvalidRequest whose message names the field and the limit; the
servicer answers it with INVALID_ARGUMENT and nothing else in the system is touched.
"""

from __future__ import annotations

import math

from fastserve.proto import scheduler_pb2 as spb
from scheduler_svc.api.text import InvalidRequest, TextModel, validate_stop
from scheduler_svc.core.job import Job, Sampling


def prompt_tokens(request: spb.GenerateRequest, text: TextModel, vocab_size: int) -> list[int]:
    kind = request.WhichOneof("prompt")
    if kind is None:
        raise InvalidRequest("prompt", "prompt: one of text, chat or token_ids is required")
    if kind == "text":
        if not request.text:
            raise InvalidRequest("text", "text: the prompt must not be empty")
        ids = text.encode(request.text)
    elif kind == "chat":
        chat = request.chat
        messages = [(m.role, m.content) for m in chat.messages]
        add = chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
        ids = text.render_chat(messages, add_generation_prompt=add)
    else:
        ids = list(request.token_ids.ids)
        if not ids:
            raise InvalidRequest("token_ids.ids", "token_ids.ids: the prompt must not be empty")
        for i, t in enumerate(ids):
            if not 0 <= t < vocab_size:
                raise InvalidRequest(
                    "token_ids.ids", f"token_ids.ids[{i}] = {t} is outside [0, {vocab_size})"
                )
    if not ids:
        raise InvalidRequest(kind, f"{kind}: the prompt tokenizes to nothing")
    return ids


def build_job(request: spb.GenerateRequest, *, job_id: int, request_id: str, now: float,
              text: TextModel, vocab_size: int, max_context: int, default_max_tokens: int,
              eos_token_ids: frozenset[int]) -> tuple[Job, list[str]]:
    """The Job for ``request`` and its stop strings; raises InvalidRequest."""
    prompt = prompt_tokens(request, text, vocab_size)
    if len(prompt) >= max_context:
        raise InvalidRequest(
            "prompt", f"prompt: {len(prompt)} tokens; the limit is {max_context - 1} "
            f"(context {max_context} tokens, at least one left to generate)",
        )
    room = max_context - len(prompt)
    s = request.sampling
    if s.HasField("max_tokens"):
        max_tokens = s.max_tokens
        if not 1 <= max_tokens <= room:
            raise InvalidRequest(
                "sampling.max_tokens", f"sampling.max_tokens must be in [1, {room}] for this "
                f"{len(prompt)}-token prompt (context {max_context}), got {max_tokens}",
            )
    else:
        max_tokens = min(default_max_tokens, room)
    temperature = s.temperature if s.HasField("temperature") else 1.0
    if not (temperature >= 0.0 and math.isfinite(temperature)):
        raise InvalidRequest("sampling.temperature",
                             f"sampling.temperature must be >= 0, got {temperature}")
    top_p = s.top_p if s.HasField("top_p") else 1.0
    if not 0.0 < top_p <= 1.0:
        raise InvalidRequest("sampling.top_p", f"sampling.top_p must be in (0, 1], got {top_p}")
    top_k = s.top_k if s.HasField("top_k") else 0
    if not 0 <= top_k <= vocab_size:
        raise InvalidRequest("sampling.top_k",
                             f"sampling.top_k must be in [0, {vocab_size}], got {top_k}")
    stop = list(s.stop)
    validate_stop(stop)
    job = Job(
        job_id=job_id,
        prompt=prompt,
        max_tokens=max_tokens,
        arrival_time=now,
        sampling=Sampling(temperature, top_p, top_k, s.seed if s.HasField("seed") else None),
        request_id=request_id,
        eos_token_ids=eos_token_ids,
        ignore_eos=s.ignore_eos,
        output_length_hint=(request.output_length_hint or None
                            if request.HasField("output_length_hint") else None),
    )
    return job, stop
