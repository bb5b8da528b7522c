"""OpenAI request bodies and their translation to the scheduler's ``GenerateRequest``.

Types are checked here (pydantic: a wrong type is a 400 naming the field); values (ranges,
sizes, the context) are checked by the scheduler, the one place that knows the model. What
the engine cannot do is refused here by name rather than silently ignored: ``n`` other than
1, penalties, ``logit_bias``, ``echo``, ``suffix``, ``best_of``, and ``top_logprobs`` and a
completion's ``logprobs`` above 0 (the engine returns the sampled token's logprob only).
Unknown fields are ignored, as OpenAI's own API does. ``priority`` is
accepted and has no effect: no FastServe policy takes a client's priority.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fastserve.proto import scheduler_pb2 as spb
from openai_svc.errors import ApiError


class StreamOptions(BaseModel):
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(extra="allow")  # unknown fields are ignored

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: dict[str, float] | None = None
    user: str | None = None
    # vLLM's extensions that clients and benchmarks rely on.
    ignore_eos: bool = False
    top_k: int | None = None
    min_tokens: int | None = None
    priority: int = 0
    request_id: str | None = None

    def include_usage(self) -> bool:
        return self.stream_options is not None and self.stream_options.include_usage

    def _refuse_unsupported(self) -> None:
        for name, default in (("n", 1), ("presence_penalty", 0.0), ("frequency_penalty", 0.0)):
            value = getattr(self, name)
            if value != default:
                raise ApiError(400, f"{name}: only {default} is supported, got {value}", name)
        if self.logit_bias:
            raise ApiError(400, "logit_bias: not supported", "logit_bias")
        if self.seed is not None and self.seed < 0:
            raise ApiError(400, f"seed: must be >= 0, got {self.seed}", "seed")

    def _sampling(self, max_tokens: int | None) -> spb.SamplingOptions:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or ())
        s = spb.SamplingOptions(stop=stops, ignore_eos=self.ignore_eos)
        for name, value in (("max_tokens", max_tokens), ("temperature", self.temperature),
                            ("top_p", self.top_p), ("top_k", self.top_k), ("seed", self.seed),
                            ("min_tokens", self.min_tokens)):
            if value is not None:
                setattr(s, name, value)
        return s


class TextPart(BaseModel):
    model_config = ConfigDict(extra="allow")
    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = ConfigDict(extra="allow")
    role: str
    content: str | list[TextPart] | None = None


class ChatCompletionRequest(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None

    def to_grpc(self, request_id: str) -> spb.GenerateRequest:
        self._refuse_unsupported()
        if self.top_logprobs:
            raise ApiError(400, "top_logprobs: only 0 is supported (the engine returns the "
                           "sampled token's logprob)", "top_logprobs")
        messages = [spb.ChatMessage(role=m.role, content=_content(i, m))
                    for i, m in enumerate(self.messages)]
        max_tokens = (self.max_completion_tokens if self.max_completion_tokens is not None
                      else self.max_tokens)
        return spb.GenerateRequest(
            request_id=request_id, sampling=self._sampling(max_tokens),
            chat=spb.ChatMessages(messages=messages, add_generation_prompt=True))


def _content(i: int, m: ChatMessage) -> str:
    if m.content is None:
        return ""
    if isinstance(m.content, str):
        return m.content
    texts = []
    for j, part in enumerate(m.content):
        if part.type != "text" or part.text is None:
            raise ApiError(400, f"messages[{i}].content[{j}]: only text parts are supported, "
                           f"got type {part.type!r}", f"messages[{i}].content")
        texts.append(part.text)
    return "".join(texts)


class CompletionRequest(_Common):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None

    def to_grpc(self, request_id: str) -> spb.GenerateRequest:
        self._refuse_unsupported()
        if self.logprobs:
            raise ApiError(400, f"logprobs: at most 0 (the sampled token's logprob only), got "
                           f"{self.logprobs}", "logprobs")
        for name, bad in (("echo", self.echo), ("suffix", self.suffix is not None),
                          ("best_of", self.best_of not in (None, 1))):
            if bad:
                raise ApiError(400, f"{name}: not supported", name)
        req = spb.GenerateRequest(request_id=request_id,
                                  sampling=self._sampling(self.max_tokens))
        prompt: Any = self.prompt
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], (str, list)):
            if len(prompt) != 1:
                raise ApiError(400, f"prompt: {len(prompt)} prompts in one request; send one "
                               "per request", "prompt")
            prompt = prompt[0]
        if isinstance(prompt, str):
            req.text = prompt
        else:
            req.token_ids.ids.extend(prompt)
        return req
