"""A workload of real instructions with natural output lengths (`--prompts FILE.jsonl`).

Each line of the file is a JSON object with an ``instruction`` string (other fields are kept
out of the request). Every instruction is sent once, in an order shuffled by the seed (with
``repeat``, the shuffled list is gone through again as often as ``num_requests`` needs), as one
user chat message: no ``ignore_eos``, so the model chooses where to stop, ``max_tokens`` as the
cap, the given temperature and top-p, and a seed of its own per request (the seed and its
index), so every run of the same workload samples the same. Arrivals are Poisson or Gamma at
``rate`` (``fastserve.traces.arrival_times``).

The trace handed to the replay has the arrival times and, as each request's output length,
the cap; the prompt's length in tokens is the server's to count (its usage), and each record
keeps the output length the model chose and why it stopped.
"""

from __future__ import annotations

import pathlib
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from fastserve.traces import TraceRequest, arrival_times, json_lines


@dataclass(frozen=True)
class ChatPrompt:
    """One request of a prompt workload: a user message and how to sample its answer."""

    text: str
    max_tokens: int
    temperature: float
    top_p: float
    seed: int
    # The answer's length measured in an earlier run, sent to the srpt-oracle policy.
    output_length_hint: int | None = None


# What one request sends: token ids (trace replay) or a chat message (a prompt workload).
Prompt = Sequence[int] | ChatPrompt


def load_instructions(path: str | pathlib.Path) -> list[str]:
    """The ``instruction`` of every line of a JSONL file; a clear error for a bad line."""
    out = []
    for n, _, row in json_lines(path, "the prompts file"):
        text = row.get("instruction") if isinstance(row, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"{path}:{n}: needs a non-empty string field 'instruction'")
        out.append(text)
    if not out:
        raise ValueError(f"{path}: no instructions")
    return out


def prompt_workload(path: str | pathlib.Path, *, rate: float | None,
                    num_requests: int | None = None, repeat: bool = False,
                    arrivals: str = "poisson", cv: float = 1.0, seed: int = 0,
                    max_tokens: int = 512, temperature: float = 0.0,
                    top_p: float = 1.0) -> tuple[list[TraceRequest], list[ChatPrompt]]:
    """The requests (arrival times, the cap as output length) and their chat prompts."""
    if rate is None or rate <= 0:
        raise ValueError("a prompt workload needs --rate > 0 (requests/s)")
    if max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {max_tokens}")
    if temperature < 0:
        raise ValueError(f"--temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"--top-p must be in (0, 1], got {top_p}")
    if seed < 0:
        raise ValueError(f"--seed must be >= 0, got {seed}")
    instructions = load_instructions(path)
    n = len(instructions) if num_requests is None else num_requests
    if n < 1:
        raise ValueError(f"--num-requests must be >= 1, got {n}")
    if n > len(instructions) and not repeat:
        raise ValueError(f"--num-requests {n} is more than the {len(instructions)} prompts in "
                         f"{path}; pass --repeat to send them more than once")
    rng = np.random.default_rng(seed)
    order: list[int] = []
    while len(order) < n:
        order.extend(rng.permutation(len(instructions)).tolist())
    times = arrival_times(n, rate, arrivals, cv, seed)
    trace = [TraceRequest(float(t), 0, max_tokens) for t in times]
    prompts = [ChatPrompt(instructions[j], max_tokens, temperature, top_p, seed * 1_000_003 + i)
               for i, j in enumerate(order[:n])]
    return trace, prompts
