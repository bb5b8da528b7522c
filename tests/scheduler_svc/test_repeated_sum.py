"""``add_repeatedly`` (core/policies/repeated_sum.py) against the loop it replaces, bit for bit."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from scheduler_svc.core.policies.repeated_sum import add_repeatedly


def _loop(x: float, c: float, n: int) -> float:
    for _ in range(n):
        x += c
    return x


@settings(max_examples=400, deadline=None)
@given(x=st.floats(0.0, 1e6), c=st.floats(0.0, 1e3), n=st.integers(0, 3_000))
def test_any_sum_is_the_loops(x: float, c: float, n: int) -> None:
    assert add_repeatedly(x, c, n).hex() == _loop(x, c, n).hex()


def test_the_terms_of_the_mlfq_enst_over_a_long_queue() -> None:
    """Quanta and their running sums as the MLFQ has them (a minimal iteration time times
    powers of 2), from 0 and from a sum already under way, over up to 200,000 jobs."""
    q1 = 0.030112  # OPT-13B/A100's minimal iteration time, seconds
    for c in [q1 * 2 ** i for i in range(8)] + [sum(q1 * 2 ** i for i in range(j))
                                                 for j in range(1, 9)]:
        for x in (0.0, 0.1, 17.3, 4_321.123):
            for n in (1, 2, 63, 1_000, 200_000):
                assert add_repeatedly(x, c, n).hex() == _loop(x, c, n).hex(), (x, c, n)


def test_ties_and_absorption() -> None:
    u = math.ulp(1.0)
    for x, c in [(1.0, u / 2), (1.0, 1.5 * u), (3.0, u), (1.0, u / 4), (2.0 ** 60, 1.0),
                 (0.0, 5e-324), (1e-310, 3e-320), (0.0, 0.0)]:
        for n in (1, 2, 3, 10, 1_001):
            assert add_repeatedly(x, c, n).hex() == _loop(x, c, n).hex(), (x, c, n)
