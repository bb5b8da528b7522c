"""The scheduler's chunks and Final -> OpenAI response objects and server-sent events.

One ``Shape`` per request knows its endpoint (chat or completion), id, model and whether it
reports logprobs; ``chunk``/``last``/``usage_chunk`` give the streamed objects and ``whole``
the non-streamed one, so both paths build the same fields.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from fastserve.proto import scheduler_pb2 as spb
from openai_svc.errors import ApiError

FINISH = {spb.FINISH_REASON_STOP: "stop", spb.FINISH_REASON_LENGTH: "length",
          spb.FINISH_REASON_CANCELLED: "abort"}


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


DONE = b"data: [DONE]\n\n"


def usage(final: spb.Final) -> dict:
    u = final.usage
    return {"prompt_tokens": u.prompt_tokens, "completion_tokens": u.completion_tokens,
            "total_tokens": u.prompt_tokens + u.completion_tokens}


def finish_reason(final: spb.Final) -> str:
    """"stop" or "length"; an error finish is raised as a 500 (the message is the worker's)."""
    if final.finish_reason == spb.FINISH_REASON_ERROR:
        raise ApiError(500, f"generation failed: {final.error_message}", code="internal_error")
    return FINISH.get(final.finish_reason, "stop")


@dataclass
class Shape:
    kind: str  # "chat" or "completion"
    request_id: str
    model: str
    logprobs: bool
    token_text: Callable[[int], str]  # a token id's text, for logprobs
    created: int = field(default_factory=lambda: int(time.time()))
    _offset: int = 0  # characters of text so far (a completion's text_offset)

    @property
    def id(self) -> str:
        return ("chatcmpl-" if self.kind == "chat" else "cmpl-") + self.request_id

    def _base(self, streamed: bool) -> dict:
        obj = ("chat.completion" if self.kind == "chat" else "text_completion")
        if streamed and self.kind == "chat":
            obj += ".chunk"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def _logprobs(self, ids: Sequence[int], lps: Sequence[float]) -> dict | None:
        if not self.logprobs:
            return None
        tokens = [self.token_text(t) for t in ids]
        if self.kind == "chat":
            return {"content": [{"token": s, "logprob": lp, "bytes": list(s.encode()),
                                 "top_logprobs": []} for s, lp in zip(tokens, lps)]}
        offsets = []
        for s in tokens:
            offsets.append(self._offset)
            self._offset += len(s)
        return {"tokens": tokens, "token_logprobs": list(lps),
                "top_logprobs": [{} for _ in tokens], "text_offset": offsets}

    def _choice(self, text: str, ids: Sequence[int], lps: Sequence[float],
                reason: str | None, message: dict | None = None) -> dict:
        """A choice: a chat's ``message`` (streamed: ``delta``) or a completion's ``text``."""
        choice: dict = {"index": 0}
        if self.kind == "chat":
            choice["delta" if message is not None else "message"] = (
                message if message is not None else {"role": "assistant", "content": text})
        else:
            choice["text"] = text
        choice["logprobs"] = self._logprobs(ids, lps)
        choice["finish_reason"] = reason
        return choice

    def _streamed(self, choice: dict, include_usage: bool) -> dict:
        obj = {**self._base(True), "choices": [choice]}
        if include_usage:
            obj["usage"] = None  # every chunk but the usage one, as OpenAI sends them
        return obj

    def first(self, include_usage: bool) -> dict:
        """A chat stream's opening chunk: the assistant role, no text."""
        return self._streamed(self._choice("", [], [], None, {"role": "assistant",
                                                              "content": ""}), include_usage)

    def chunk(self, c: spb.Chunk, include_usage: bool) -> dict:
        return self._streamed(self._choice(c.text, c.token_ids, c.logprobs, None,
                                           {"content": c.text}), include_usage)

    def last(self, final: spb.Final, include_usage: bool) -> dict:
        """The stream's closing chunk: no text, the finish reason."""
        return self._streamed(self._choice("", [], [], finish_reason(final), {}), include_usage)

    def usage_chunk(self, final: spb.Final) -> dict:
        return {**self._base(True), "choices": [], "usage": usage(final)}

    def whole(self, text: str, ids: Sequence[int], lps: Sequence[float],
              final: spb.Final) -> dict:
        """The non-streamed response."""
        return {**self._base(False),
                "choices": [self._choice(text, ids, lps, finish_reason(final))],
                "usage": usage(final)}
