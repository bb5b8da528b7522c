"""Answers that loop: the last tokens an answer made occur earlier in it.

At a low temperature a small model that starts repeating itself nearly always goes on to its
cap: of the default model's answers to 96 training prompts (temperature 0.2, top-p 0.9, cap
512), 55 were flagged with 32 repeated tokens and 48 of those ran to the cap
(docs/benchmarks.md, "Answers that loop"). The output-length predictor reads this from the
tokens rather than the hidden state (``worker_svc.predictor``). No torch here: the CLIs read
the default.
"""

from __future__ import annotations

import argparse
from array import array
from collections.abc import Sequence

# Repeated tokens that flag an answer as looping, chosen on the training prompts' answers:
# fewer flag long answers that end on their own, more flag loops later.
LOOP_NGRAM = 32
# ``--loop-ngram`` of the worker, ``fastserve serve`` and ``bench compare``.
LOOP_HELP = ("the output-length predictor calls an answer whose last N tokens occur earlier in "
             f"it a loop that runs to its cap (default {LOOP_NGRAM}; 0: never)")


def ngram_arg(text: str) -> int:
    """``--loop-ngram``'s value: a whole number, at least 0."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"--loop-ngram must be a whole number >= 0 (0: no "
                                         f"loop check), got {text!r}")
    return n


def loops(output: Sequence[int], n: int) -> bool:
    """Whether the last ``n`` tokens of ``output`` occur earlier in it (the two occurrences
    may overlap: a token repeated n + 1 times loops). The tokens are searched as 8-byte words
    (a C search over bytes), so a match must start on a word."""
    g = len(output)
    if n <= 0 or g <= n:
        return False
    words = array("q", output)
    w = words.itemsize
    data = words.tobytes()
    pattern = data[w * (g - n):]
    end = w * (g - 1)  # an earlier occurrence starts at token g - n - 1 at the latest
    at = data.find(pattern, 0, end)
    while at >= 0:
        if at % w == 0:
            return True
        at = data.find(pattern, at + 1, end)
    return False
