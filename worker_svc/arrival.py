"""Output-length estimates at arrival (``StepRequest.probes``): the predictor read at the last
token of a prompt that has not been admitted, so the scheduler can rank a waiting job before
its prefill.

A probe carries the prompt's last tokens (its tail) and the whole prompt's length. The tail
runs through the decoder as a sequence of its own (positions 0..n-1, causal attention over
the tail only; ``LlamaModel.hidden_at``) up to the predictor's layer, keeping no KV, and the
predictor reads the residual stream at its last token with the features the first token's
prediction has (prompt length, one token generated). When the tail is the whole prompt, the
estimate is the one the job's first token will bring, up to float rounding.

| what                      | meaning                                                         |
|---------------------------|-----------------------------------------------------------------|
| ``predicted_output_tokens`` | the whole answer's tokens: 1 (the first) + the predicted rest |
| a probe that is invalid   | skipped with a log line, no estimate; nothing else is touched   |
| a failed pass             | logged; its probes get no estimate; jobs and tokens unaffected  |
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from worker_svc.model.llama import LlamaModel
from worker_svc.parallel.group import GroupLost
from worker_svc.predictor import LengthPredictor

log = logging.getLogger(__name__)

# Longest tail a probe may carry (the model's max context, if smaller).
MAX_PROBE_TOKENS = 1024
# Tokens of one packed forward: more probes in a Step run in several passes, which bounds the
# memory of a Step full of probes.
PASS_TOKENS = 4096
# The first token's prediction is made once that token is appended: one token generated
# (``Engine.observe`` passes ``num_generated``), so the predicted rest is after it.
FIRST_TOKEN_GENERATED = 1
# The largest float32: beyond it the wire's float would be infinite.
_FLOAT32_MAX = 3.4028234663852886e38


@dataclass
class ArrivalProbe:
    """A job not admitted here whose output length to estimate."""

    job_id: int
    token_ids: list[int]  # the prompt's last tokens, at most the whole prompt
    prompt_tokens: int  # the whole prompt's length, >= len(token_ids)


@dataclass
class ArrivalEstimate:
    job_id: int
    # Predicted output tokens of the whole answer, the first token included.
    predicted_output_tokens: float


def problem(p: ArrivalProbe, vocab_size: int, max_context: int) -> str | None:
    """Why ``p`` cannot be answered, or None when it can."""
    n = len(p.token_ids)
    cap = min(MAX_PROBE_TOKENS, max_context)
    if n == 0:
        return "token_ids must not be empty"
    if n > cap:
        return f"token_ids has {n} tokens; the limit is {cap}"
    if p.prompt_tokens < n:
        return f"prompt_tokens {p.prompt_tokens} is less than len(token_ids) {n}"
    if p.prompt_tokens >= max_context:
        return (f"prompt_tokens {p.prompt_tokens} leaves no room to generate: the limit is "
                f"{max_context - 1} (max context {max_context})")
    bad = next((t for t in p.token_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        return f"token_ids contains {bad}, outside [0, {vocab_size})"
    return None


def passes(probes: Sequence[ArrivalProbe],
           budget: int = PASS_TOKENS) -> list[list[ArrivalProbe]]:
    """``probes`` in order, in packed passes of at most ``budget`` tokens (a longer probe
    alone)."""
    out: list[list[ArrivalProbe]] = []
    tokens = budget
    for p in probes:
        if tokens + len(p.token_ids) > budget:
            out.append([])
            tokens = 0
        out[-1].append(p)
        tokens += len(p.token_ids)
    return out


def estimate(model: LlamaModel, probes: Sequence[ArrivalProbe], layer: int,
             predictor: LengthPredictor | None, device: torch.device) -> list[ArrivalEstimate]:
    """Run valid ``probes`` to ``layer`` and, with a ``predictor``, estimate each one, in
    order. Without one (a tensor-parallel follower, whose rank 0 reads the predictor) only
    the forward passes run, so every rank meets the same collectives; it returns nothing.

    A pass that raises loses its probes' estimates (logged); an estimate that is not a
    finite float32 is left out."""
    out: list[ArrivalEstimate] = []
    for group in passes(probes):
        try:
            out.extend(_estimate_pass(model, group, layer, predictor, device))
        except GroupLost:
            raise
        except Exception:  # a failed probe costs estimates, never a job
            log.exception("arrival probes of jobs %s failed; no estimates for them",
                          [p.job_id for p in group])
    return out


def _estimate_pass(model: LlamaModel, group: list[ArrivalProbe], layer: int,
                   predictor: LengthPredictor | None,
                   device: torch.device) -> list[ArrivalEstimate]:
    ids = torch.tensor([t for p in group for t in p.token_ids], dtype=torch.long, device=device)
    hidden = model.hidden_at(ids, [len(p.token_ids) for p in group], layer)
    if predictor is None:
        return []
    remaining = predictor.observe({layer: hidden}, [p.job_id for p in group],
                                  [p.prompt_tokens for p in group],
                                  [FIRST_TOKEN_GENERATED] * len(group))
    out = []
    for p, rest in zip(group, remaining, strict=True):
        total = FIRST_TOKEN_GENERATED + rest
        if not math.isfinite(total) or total > _FLOAT32_MAX:
            log.warning("arrival estimate of job %d is %r; left out", p.job_id, total)
            continue
        out.append(ArrivalEstimate(p.job_id, total))
    return out
