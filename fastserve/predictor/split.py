"""The held-out split of a prompt file: fixed by each instruction's text, not by its position.

An instruction is held out when the first 32 bits of its SHA-1 fall below ``fraction`` of the
range, so the split is the same on every machine, for any order of the file, and a prompt
added later never moves an old one across it. Duplicated instructions land on the same side.
"""

from __future__ import annotations

import hashlib


def held_out(text: str, fraction: float) -> bool:
    digest = hashlib.sha1(text.encode("utf-8")).digest()
    return int.from_bytes(digest[:4], "big") < fraction * 2 ** 32


def split(instructions: list[str], fraction: float) -> tuple[list[int], list[int]]:
    """Indices of the training and the held-out instructions."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"--holdout must be in (0, 1), got {fraction}")
    test = [i for i, t in enumerate(instructions) if held_out(t, fraction)]
    chosen = set(test)
    return [i for i in range(len(instructions)) if i not in chosen], test
