"""``x + c + c + ... + c`` (n additions, each rounded), bit for bit, without the n steps.

The MLFQ's ENST sums a term per queued job; the jobs that have not run all add the same
terms, so under overload the sums took a step per queued job and every Step grew with the
queue. Adding ``c`` to a float ``x`` in the binade [2^(e-1), 2^e) rounds ``x + c`` to the
spacing ``u`` of that binade, and since ``x`` is a multiple of ``u`` the increment is the same
for every ``x`` there (unless ``c`` lies exactly half-way between two multiples of ``u``: then
the tie goes to even and alternates). So the additions that stay in one binade add a constant,
counted at once in integer units of ``u``; the few that cross a binade, hit a tie or are
absorbed are taken one by one. The cost is the number of binades crossed, not n.
"""

from __future__ import annotations

import math

# Floats of 53 significant bits: a binade holds 2^52 of them, its end is 2^53 spacings away.
_SPAN = 1 << 53


def add_repeatedly(x: float, c: float, n: int) -> float:
    """What ``for _ in range(n): x += c`` leaves in ``x``, for finite ``x, c >= 0``."""
    while n > 0:
        y = x + c  # one addition as it comes: into a new binade, a tie, the first
        n -= 1
        if y == x:
            return x  # absorbed: every later addition is too
        x = y
        if n == 0:
            break
        _, e = math.frexp(x)  # x in [2^(e-1), 2^e)
        if e < -1000:
            continue  # near the subnormals: one by one
        u = math.ldexp(1.0, e - 53)  # the spacing of the floats in x's binade
        if 2.0 * math.fmod(c, u) == u:
            continue  # c is half-way: ties to even alternate, one by one
        step = (x + c) - x  # exact: both are multiples of u
        units, inc = int(x / u), int(step / u)
        k = min(n, (_SPAN - 1 - units) // inc)  # additions that stay in this binade
        if k > 0:
            x = float(units + k * inc) * u
            n -= k
    return x
