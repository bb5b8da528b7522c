"""Answers that loop (``worker_svc.loops``): the last n tokens occur earlier in the answer;
the same answer as a search token by token, for any sequence; matches only on whole tokens."""

from __future__ import annotations

import random

import pytest

from worker_svc.loops import loops


def _by_hand(output: list[int], n: int) -> bool:
    """The definition, token by token: an earlier start s (s + n < len) of the last n tokens."""
    g = len(output)
    return n > 0 and g > n and any(output[s:s + n] == output[g - n:] for s in range(g - n))


def test_a_repeated_passage_loops_once_n_of_its_tokens_have_come_round_again():
    passage = [101, 7, 2048, 55, 9, 300, 12]  # period 7
    answer = list(range(1000, 1040)) + passage * 10
    first = next(g for g in range(len(answer) + 1) if loops(answer[:g], 16))
    assert first == 40 + 7 + 16  # 16 tokens of the second round, matching the first's
    assert not loops(list(range(500)), 16)  # no token twice


def test_one_token_repeated_loops_with_overlapping_occurrences():
    assert not loops([5] * 32, 32)  # the last 32 are all there is
    assert loops([5] * 33, 32)  # they also start one token earlier
    assert loops([3, 5, 5], 1) and not loops([3, 5], 1)


def test_only_whole_tokens_match():
    a, b = 0x0877665544332211, 0x00FFEEDDCCBBAA99
    # A token whose 8 bytes are a's last six and b's first two, as stored.
    words = a.to_bytes(8, "little") + b.to_bytes(8, "little")
    c = int.from_bytes(words[2:10], "little", signed=True)
    assert not loops([a, b, c], 1)
    assert loops([c, b, c], 1)


def test_off_or_too_short():
    assert not loops([1, 1, 1, 1], 0)
    assert not loops([], 3) and not loops([1, 2, 3], 3)


@pytest.mark.parametrize("seed", range(4))
def test_the_same_answer_as_the_definition(seed):
    rng = random.Random(seed)
    for _ in range(300):
        alphabet = rng.choice((2, 3, 5, 1 << 30))  # few symbols: many repeats
        out = [rng.randrange(alphabet) for _ in range(rng.randrange(0, 40))]
        n = rng.randrange(0, 8)
        assert loops(out, n) == _by_hand(out, n), (out, n)
