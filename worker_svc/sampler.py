"""Token sampling: greedy, temperature, top-k, top-p, reproducible per job.

Randomness for a job's n-th sampled token comes from a generator seeded with (seed, n), so a
job draws the same tokens whatever else shares the batch, and a job recomputed after a
preemption draws what it would have drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

# Temperatures below this sample greedily (vLLM's rule): dividing logits by 1e-45 made them
# infinite and the row's probabilities NaN.
GREEDY_BELOW = 1e-5
_MIX = 0x9E3779B97F4A7C15  # odd 64-bit constant: spreads consecutive step numbers apart
_MASK = (1 << 63) - 1


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0  # 0 = off
    seed: int | None = None
    min_tokens: int = 0  # ``suppress`` ids are not sampled before the job has made this many
    suppress: tuple[int, ...] = ()

    def validate(self, vocab_size: int) -> str | None:
        """Why these parameters are unusable, or None."""
        if not (self.temperature >= 0.0 and math.isfinite(self.temperature)):
            return f"temperature must be finite and >= 0, got {self.temperature}"
        if not 0.0 < self.top_p <= 1.0:
            return f"top_p must be in (0, 1], got {self.top_p}"
        if self.top_k < 0:
            return f"top_k must be >= 0, got {self.top_k}"
        if self.top_k > vocab_size:
            return f"top_k must be <= vocab size {vocab_size}, got {self.top_k}"
        if self.min_tokens < 0:
            return f"min_tokens must be >= 0, got {self.min_tokens}"
        bad = [t for t in self.suppress if not 0 <= t < vocab_size]
        if bad:
            return f"suppress_token_ids {bad[:4]} outside [0, {vocab_size})"
        return None

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW or self.top_k == 1


def step_seed(seed: int, step: int) -> int:
    return ((seed & _MASK) * _MIX + step * 0x632BE59BD9B4E019 + 1) & _MASK


class SamplingFailed(ValueError):
    """One row's numbers cannot be sampled from (not finite, no mass): its job fails."""


def sample(logits: torch.Tensor, params: list[SamplingParams], steps: list[int],
           default_seeds: list[int]) -> tuple[list[int], list[float], dict[int, str]]:
    """Pick one token per row of ``logits`` ``[S, vocab]`` (float32).

    ``steps[i]`` is how many tokens row i's job has made (a job short of its ``min_tokens``
    samples none of its ``suppress`` ids). Returns the token ids and their log-probabilities
    under the model's unmodified distribution (temperature 1, no truncation, nothing
    suppressed), as OpenAI-style APIs report them, and the rows that could not be sampled
    (row -> why): only their jobs fail, never the batch.
    """
    failed: dict[int, str] = {}
    logprobs_all = torch.log_softmax(logits, dim=-1)
    held = [i for i, p in enumerate(params) if p.suppress and steps[i] < p.min_tokens]
    if held:  # not yet min_tokens: their end-of-sequence ids cannot be picked
        logits = logits.clone()
        for i in held:
            logits[i, list(params[i].suppress)] = float("-inf")
    sampled_rows = [i for i, p in enumerate(params) if not p.greedy]
    # None when every row is sampled (a failed row's token is never used).
    tokens = [0] * len(params) if len(sampled_rows) == len(params) else _argmax(logits)
    for i in sampled_rows:
        p = params[i]
        seed = p.seed if p.seed is not None else default_seeds[i]
        gen = torch.Generator(device=logits.device)
        gen.manual_seed(step_seed(seed, steps[i]))
        try:
            tokens[i] = _sample_row(logits[i], p, gen)
        except (SamplingFailed, RuntimeError) as e:
            failed[i] = (f"sampling failed at temperature {p.temperature}, "
                         f"top_p {p.top_p}, top_k {p.top_k}: {e}")
    rows = torch.tensor(tokens, device=logits.device).view(-1, 1)
    picked = logprobs_all.gather(1, rows).view(-1).tolist()
    return tokens, picked, failed


def _argmax(logits: torch.Tensor) -> list[int]:
    """Each row's first highest logit. On the host NumPy's argmax: ``torch.argmax`` took
    0.17 ms over 8 rows of 49k, NumPy's 0.03 ms (the same index, NaN first as in torch)."""
    if logits.device.type == "cpu":
        return np.argmax(logits.numpy(), axis=-1).tolist()
    return torch.argmax(logits, dim=-1).tolist()


def _sample_row(row: torch.Tensor, p: SamplingParams, gen: torch.Generator) -> int:
    """One draw by the inverse of the cumulative distribution (one uniform from ``gen``):
    ``torch.multinomial`` took 1 ms per draw over the whole vocabulary, this 0.04 ms. A token
    of probability 0 is never drawn (its interval of the CDF is empty)."""
    ids, probs = _nucleus(row, p)
    cdf = np.cumsum(probs, dtype=np.float64)
    total = float(cdf[-1])
    if not (math.isfinite(total) and total > 0.0):
        raise SamplingFailed("the distribution is not finite")
    u = torch.rand((), generator=gen, dtype=torch.float64, device=row.device).item() * total
    return int(ids[min(int(np.searchsorted(cdf, u, side="right")), len(ids) - 1)])


def nucleus(row: torch.Tensor, p: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
    """The tokens ``p`` may draw from ``row`` (one row of logits) and their probabilities:
    temperature, then the ``top_k`` highest, then the smallest set of the highest whose mass
    reaches ``top_p`` (the first always kept), renormalized."""
    ids, probs = _nucleus(row, p)
    return torch.from_numpy(ids), torch.from_numpy(probs)


def _nucleus(row: torch.Tensor, p: SamplingParams) -> tuple[np.ndarray, np.ndarray]:
    """``nucleus`` on the host, in NumPy (ids int64, probabilities float32).

    Only candidates are sorted: the top k, or for top-p alone the tokens of probability at
    least (1 - top_p) / vocabulary (``_candidates``; the whole row, should rounding leave
    them short of top_p). Sorting the whole 49k-token row for every sampled token took 4.5 ms
    of CPU per job and step, as long as a decode of 8 jobs; the top 64 by ``torch.topk`` and
    the cut in small tensor ops 0.22 ms; this about 0.1 ms.
    """
    vocab = row.shape[-1]
    if p.top_k > 0:
        vals, idx = torch.topk(row / p.temperature, min(p.top_k, vocab))
        ids = idx.cpu().numpy()
        probs = torch.softmax(vals, dim=-1).cpu().numpy()
    else:
        full = torch.softmax(row / p.temperature, dim=-1)
        if p.top_p >= 1.0:
            return np.arange(vocab), full.cpu().numpy()
        ids, probs = _candidates(full, p.top_p)
        if not probs.sum(dtype=np.float64) >= p.top_p:  # rounding, or numbers not finite
            ids, probs = np.arange(vocab), full.cpu().numpy()
        order = np.argsort(-probs, kind="stable")
        ids, probs = ids[order], probs[order]
    if p.top_p < 1.0:
        # probs are the kept distribution's (top-k: its softmax; top-p alone: the full one's),
        # sorted. Drop a token when the tokens before it already reach top_p; the first stays.
        before = np.cumsum(probs, dtype=np.float64) - probs
        n = max(int(np.count_nonzero(before < p.top_p)), 1)
        ids, probs = ids[:n], probs[:n]
    return ids, probs / probs.sum(dtype=np.float32)


def _candidates(full: torch.Tensor, top_p: float) -> tuple[np.ndarray, np.ndarray]:
    """The tokens of probability at least (1 - top_p) / vocabulary in ``full`` (a
    distribution), and their probabilities: the others weigh less than 1 - top_p together,
    so these hold the nucleus (up to rounding, which ``_nucleus`` checks)."""
    floor = (1.0 - top_p) / full.shape[-1]
    if full.device.type == "cpu":
        every = full.numpy()
        ids = np.flatnonzero(every >= floor)
        return ids, every[ids]
    cand = torch.nonzero(full >= floor).view(-1)  # only the candidates cross to the host
    return cand.cpu().numpy(), full[cand].cpu().numpy()
