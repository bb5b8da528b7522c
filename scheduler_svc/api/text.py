"""Text in and out of the scheduler: tokenize prompts, render chats, stream output text.

The scheduler core works in token ids; this module is the one place that turns text into ids
and ids back into text. ``transformers`` is imported only by ``TextModel.load`` (it pulls in
torch), so the validation helpers stay cheap to import.

Streaming output text has two hazards, handled by ``IncrementalDetokenizer``:

| hazard                                    | held back until                                  |
|-------------------------------------------|--------------------------------------------------|
| a character split over byte-level tokens  | the decoded window no longer ends in U+FFFD      |
| text that may be the start of a stop string | it cannot be, or the stop string completes     |
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ALLOWED_ROLES = ("system", "user", "assistant", "tool")
MAX_STOPS = 16
MAX_STOP_LEN = 256
# Prompt tokens decoded ahead of the output, so that tokenizers whose decoders strip a
# leading space (SentencePiece) see the output token in context; vLLM uses the same 5.
_SEED_TOKENS = 5
_REPLACEMENT = "\ufffd"


class InvalidRequest(ValueError):
    """A request field is invalid.

    ``str(exc)`` is ``message`` if it already starts with ``field``, else
    ``"<field>: <message>"``, so the text a client sees always names the field once.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message if message.startswith(field) else f"{field}: {message}")
        self.field = field
        self.message = message


def validate_stop(
    stop: Sequence[str], max_stops: int = MAX_STOPS, max_len: int = MAX_STOP_LEN
) -> None:
    """Raise ``InvalidRequest`` on field ``sampling.stop`` unless ``stop`` is within limits.

    At most ``max_stops`` strings, each non-empty and at most ``max_len`` characters.
    """
    if len(stop) > max_stops:
        raise InvalidRequest(
            "sampling.stop", f"{len(stop)} stop strings given, at most {max_stops} allowed"
        )
    for i, s in enumerate(stop):
        if not s:
            raise InvalidRequest(
                "sampling.stop", f"entry {i} is empty; stop strings must be non-empty"
            )
        if len(s) > max_len:
            raise InvalidRequest(
                "sampling.stop", f"entry {i} is {len(s)} characters long, at most {max_len} allowed"
            )


class TextModel:
    """A model's tokenizer plus the facts the scheduler needs about its vocabulary."""

    def __init__(self, tokenizer: PreTrainedTokenizerBase, eos_token_ids: Iterable[int] = ()):
        """Wrap a loaded HF tokenizer; ``eos_token_ids`` adds to the tokenizer's own eos."""
        self.tokenizer = tokenizer
        eos = set(eos_token_ids)
        if tokenizer.eos_token_id is not None:
            eos.add(tokenizer.eos_token_id)
        self._eos_token_ids = frozenset(eos)

    @classmethod
    def load(cls, path_or_id: Any) -> TextModel:
        """Load the tokenizer and ``generation_config.json`` eos ids from a directory or hub id."""
        from transformers import AutoTokenizer, GenerationConfig

        # Cleanup ("hello ." -> "hello.") is lossy and not local to a token, so streamed text
        # could never match it; some configs (e.g. GGUF conversions) turn it on.
        tokenizer = AutoTokenizer.from_pretrained(path_or_id, clean_up_tokenization_spaces=False)
        try:
            eos = GenerationConfig.from_pretrained(path_or_id).eos_token_id
        except OSError:  # no generation_config.json: the tokenizer's eos is all there is
            eos = None
        extra = [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
        return cls(tokenizer, extra)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included (``len(tokenizer)``)."""
        return len(self.tokenizer)

    @property
    def eos_token_ids(self) -> frozenset[int]:
        """Ids that end generation: the tokenizer's eos plus the generation config's."""
        return self._eos_token_ids

    def encode(self, text: str) -> list[int]:
        """Token ids of a plain-text prompt, with whatever special tokens the tokenizer adds."""
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, token_ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of ``token_ids``, never with tokenization-space cleanup."""
        return self.tokenizer.decode(
            token_ids,
            skip_special_tokens=skip_special_tokens,
            clean_up_tokenization_spaces=False,
        )

    def render_chat(
        self, messages: Sequence[tuple[str, str]], add_generation_prompt: bool = True
    ) -> list[int]:
        """Token ids of ``(role, content)`` messages rendered by the model's chat template.

        Raises ``InvalidRequest`` for no messages, a role outside ``ALLOWED_ROLES``, a model
        without a chat template, or a template that rejects the conversation.
        """
        if not messages:
            raise InvalidRequest("chat.messages", "at least one message is required")
        for i, (role, _) in enumerate(messages):
            if role not in ALLOWED_ROLES:
                raise InvalidRequest(
                    f"chat.messages[{i}].role",
                    f"{role!r} is not one of {', '.join(ALLOWED_ROLES)}",
                )
        if not getattr(self.tokenizer, "chat_template", None):
            raise InvalidRequest("chat", "the model has no chat template; send a text prompt")
        from jinja2 import TemplateError

        conversation = [{"role": role, "content": content} for role, content in messages]
        try:
            ids = self.tokenizer.apply_chat_template(
                conversation, add_generation_prompt=add_generation_prompt, tokenize=True
            )
        except TemplateError as e:  # templates reject e.g. non-alternating roles this way
            raise InvalidRequest("chat.messages", f"rejected by the chat template: {e}") from e
        return list(ids)


@dataclass(frozen=True)
class Delta:
    """Text that became safe to emit; ``stopped`` once a stop string was found."""

    text: str
    stopped: bool = False
    stop_string: str | None = None


class IncrementalDetokenizer:
    """Turns one request's output token ids into text deltas, honouring stop strings.

    Concatenating every ``add(...).text`` and ``finish()`` gives ``text_model.decode(output)``,
    cut before the first stop string (the occurrence that ends first; on a tie, the longest),
    which is itself never returned. Each token costs O(1) decoding: only a sliding window of
    ids is decoded, from ``prefix`` (already-emitted context) to the end, and the text past
    ``decode(window[:read])`` is new.
    """

    def __init__(
        self,
        text_model: TextModel,
        prompt_token_ids: Sequence[int],
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
        min_tokens: int = 0,
    ) -> None:
        """Seed the window with the prompt's last tokens; ``stop`` must be non-empty strings.
        The text of the first ``min_tokens - 1`` tokens is never searched for them (vLLM's
        min_tokens: a stop string ends the output only once it has that many tokens)."""
        if any(not s for s in stop):
            raise InvalidRequest("sampling.stop", "stop strings must be non-empty")
        self._model = text_model
        self._skip_special_tokens = skip_special_tokens
        self._stops = tuple(dict.fromkeys(stop))
        window = list(prompt_token_ids[-_SEED_TOKENS:])
        self._prefix_text = self._decode(window)
        if self._prefix_text.endswith(_REPLACEMENT):
            # The prompt ends mid-character: the output's first bytes would complete it and
            # shift the text we slice against, so decode the output on its own instead.
            window, self._prefix_text = [], ""
        self._window = window  # ids from the prefix offset on
        self._read = len(window)  # window[:read] is already turned into text
        self._pending = ""  # decoded text held back because it may start a stop string
        self._emitted: list[str] = []
        self._stop_string: str | None = None
        self._finished = False
        self._min_tokens = min_tokens
        self._count = 0  # output tokens added

    @property
    def text(self) -> str:
        """Everything emitted so far."""
        return "".join(self._emitted)

    @property
    def stop_string(self) -> str | None:
        """The stop string that ended the output, if one did."""
        return self._stop_string

    def add(self, token_ids: Sequence[int]) -> Delta:
        """Take newly generated ids; return the text now safe to emit."""
        assert not self._finished, "add() after finish()"
        if self._stop_string is not None:
            return Delta("", True, self._stop_string)
        free, new = [], []  # text before min_tokens (not searched), and after
        for token_id in token_ids:
            self._window.append(token_id)
            self._count += 1
            full = self._decode(self._window)
            if len(full) > len(self._prefix_text) and not full.endswith(_REPLACEMENT):
                (free if self._count < self._min_tokens else new).append(
                    full[len(self._prefix_text) :])
                del self._window[: self._read]
                self._read = len(self._window)
                self._prefix_text = self._decode(self._window)
        if not free:
            return self._release("".join(new), final=False)
        self._emitted.append("".join(free))
        delta = self._release("".join(new), final=False)
        return Delta("".join(free) + delta.text, delta.stopped, delta.stop_string)

    def finish(self) -> str:
        """End of generation (eos or length): return the rest, incomplete bytes included.

        Check ``stop_string`` afterwards: held-back text can still complete a stop string.
        """
        if self._finished or self._stop_string is not None:
            return ""
        self._finished = True
        tail = self._decode(self._window)[len(self._prefix_text) :]
        return self._release(tail, final=True).text

    def _decode(self, token_ids: list[int]) -> str:
        return self._model.decode(token_ids, skip_special_tokens=self._skip_special_tokens)

    def _release(self, new_text: str, final: bool) -> Delta:
        pending = self._pending + new_text
        # Emitted text never ends in a stop-string prefix, so every stop occurrence not yet
        # seen starts inside ``pending``.
        best: tuple[int, int, str] | None = None
        for s in self._stops:
            start = pending.find(s)
            if start >= 0 and (best is None or (start + len(s), start) < best[:2]):
                best = (start + len(s), start, s)
        if best is not None:
            out, self._pending, self._stop_string = pending[: best[1]], "", best[2]
        else:
            cut = len(pending) if final else len(pending) - self._stop_prefix_len(pending)
            out, self._pending = pending[:cut], pending[cut:]
        self._emitted.append(out)
        return Delta(out, self._stop_string is not None, self._stop_string)

    def _stop_prefix_len(self, text: str) -> int:
        """Length of the longest suffix of ``text`` that is a proper prefix of a stop string."""
        longest, n = 0, len(text)
        for s in self._stops:
            # Only positions holding the stop's first character can start a match.
            j = text.find(s[0], max(n - len(s) + 1, 0))
            while j != -1 and n - j > longest:
                if s.startswith(text[j:]):
                    longest = n - j
                    break
                j = text.find(s[0], j + 1)
        return longest
