"""Turn a GenerateRequest into a scheduler Job: tokenize, render chat, validate every field.

Every rejection is an InvalidRequest whose message names the field and the limit; the
servicer answers it with INVALID_ARGUMENT and nothing else in the system is touched. Sizes
(bytes, messages, ids) are checked before any tokenizing, and the servicer runs this off its
event loop, so one large request delays no other stream.
"""

from __future__ import annotations

from fastserve.proto import scheduler_pb2 as spb
from scheduler_svc.api.text import InvalidRequest, TextModel, validate_stop
from scheduler_svc.core.job import Job, Sampling

# Bytes of prompt text per token of context a request may send: a token is a few bytes of
# text, so no prompt that fits the context is near this, and a 4 MB prompt is refused before
# it is tokenized (it once held the scheduler for 12 s).
MAX_PROMPT_BYTES_PER_TOKEN = 32
MAX_CHAT_MESSAGES = 1024
MAX_REQUEST_ID_LEN = 256
# Higher is refused; a vanishing one samples greedily on the worker (worker_svc/sampler.py).
MAX_TEMPERATURE = 100.0


def validate_request_id(request_id: str) -> None:
    if len(request_id) > MAX_REQUEST_ID_LEN:
        raise InvalidRequest("request_id", f"request_id: {len(request_id)} characters; the "
                             f"limit is {MAX_REQUEST_ID_LEN}")


def _check_bytes(field: str, size: int, max_context: int) -> None:
    limit = MAX_PROMPT_BYTES_PER_TOKEN * max_context
    if size > limit:
        raise InvalidRequest(field, f"{field}: {size} bytes; the limit is {limit} "
                             f"({MAX_PROMPT_BYTES_PER_TOKEN} per token of the {max_context}-"
                             "token context)")


def prompt_tokens(request: spb.GenerateRequest, text: TextModel, vocab_size: int,
                  max_context: int) -> list[int]:
    """The prompt's token ids; sizes are checked before any tokenizing."""
    kind = request.WhichOneof("prompt")
    if kind is None:
        raise InvalidRequest("prompt", "prompt: one of text, chat or token_ids is required")
    if kind == "text":
        if not request.text:
            raise InvalidRequest("text", "text: the prompt must not be empty")
        _check_bytes("text", len(request.text.encode()), max_context)
        ids = text.encode(request.text)
    elif kind == "chat":
        chat = request.chat
        if len(chat.messages) > MAX_CHAT_MESSAGES:
            raise InvalidRequest("chat.messages", f"chat.messages: {len(chat.messages)} "
                                 f"messages; the limit is {MAX_CHAT_MESSAGES}")
        _check_bytes("chat.messages", sum(len(m.content.encode()) + len(m.role)
                                          for m in chat.messages), max_context)
        messages = [(m.role, m.content) for m in chat.messages]
        add = chat.add_generation_prompt if chat.HasField("add_generation_prompt") else True
        ids = text.render_chat(messages, add_generation_prompt=add)
    else:
        ids = list(request.token_ids.ids)
        if not ids:
            raise InvalidRequest("token_ids.ids", "token_ids.ids: the prompt must not be empty")
        if len(ids) >= max_context:
            raise InvalidRequest("token_ids.ids", f"token_ids.ids: {len(ids)} tokens; the "
                                 f"limit is {max_context - 1} (context {max_context} tokens)")
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
    validate_request_id(request_id)
    prompt = prompt_tokens(request, text, vocab_size, max_context)
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
    if not 0.0 <= temperature <= MAX_TEMPERATURE:  # NaN fails too
        raise InvalidRequest("sampling.temperature", f"sampling.temperature must be in [0, "
                             f"{MAX_TEMPERATURE:g}], got {temperature}")
    top_p = s.top_p if s.HasField("top_p") else 1.0
    if not 0.0 < top_p <= 1.0:
        raise InvalidRequest("sampling.top_p", f"sampling.top_p must be in (0, 1], got {top_p}")
    top_k = s.top_k if s.HasField("top_k") else 0
    if not 0 <= top_k <= vocab_size:
        raise InvalidRequest("sampling.top_k",
                             f"sampling.top_k must be in [0, {vocab_size}], got {top_k}")
    min_tokens = s.min_tokens if s.HasField("min_tokens") else 0
    if not 0 <= min_tokens <= max_tokens:
        raise InvalidRequest("sampling.min_tokens", f"sampling.min_tokens must be in [0, "
                             f"max_tokens={max_tokens}], got {min_tokens}")
    stop = list(s.stop)
    validate_stop(stop)
    job = Job(
        job_id=job_id,
        prompt=prompt,
        max_tokens=max_tokens,
        arrival_time=now,
        sampling=Sampling(temperature, top_p, top_k, s.seed if s.HasField("seed") else None,
                          min_tokens, tuple(sorted(eos_token_ids)) if min_tokens else ()),
        request_id=request_id,
        eos_token_ids=eos_token_ids,
        ignore_eos=s.ignore_eos,
        output_length_hint=(request.output_length_hint or None
                            if request.HasField("output_length_hint") else None),
    )
    return job, stop
