"""A replay's capacity: output tokens per second while the server had a queue.

A replay sent above capacity ends with a drain, the last long answers decoding in a batch
that no longer fills, so its tokens over its makespan understate what the server sustains
(6 % on the held-out prompts at batch 8). What it sustains is the rate while requests were
kept waiting: from the arrival of the first request that waited at least ``min_wait_s`` in the
server's queue to the start of the last one that did, the output tokens made in that window
(each request's tokens after its first spread evenly from its first token to its finish)
over the window's length. Loads "at 0.85 of capacity" are fractions of this figure.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# A request that waited this long in the server's queue found the batch (or the KV) full,
# not just the next iteration.
MIN_WAIT_S = 1.0


def tokens_made(record: dict[str, Any], start: float, end: float) -> float:
    """Output tokens of one completed request made within [start, end): its first at its
    first-token time, the rest spread evenly until its finish."""
    first, finish, n = record["first_token"], record["finish"], record["output_tokens"]
    made = 1.0 if start <= first < end else 0.0
    if n > 1 and finish > first:
        overlap = min(end, finish) - max(start, first)
        made += max(0.0, overlap) / (finish - first) * (n - 1)
    return made


def saturated_throughput(records: Sequence[dict[str, Any]], min_wait_s: float = MIN_WAIT_S
                         ) -> dict[str, float | None]:
    """``saturated_tokens_s`` (None when no request waited ``min_wait_s``) and the window
    it was measured over, ``saturated_window_s``."""
    done = [r for r in records if r.get("error") is None and r.get("finish") is not None
            and r.get("first_token") is not None and (r.get("output_tokens") or 0) > 0]
    waited = [(r["arrival"], r["arrival"] + r["server_queue_time_s"]) for r in done
              if (r.get("server_queue_time_s") or 0.0) >= min_wait_s]
    if not waited:
        return {"saturated_tokens_s": None, "saturated_window_s": None}
    start = min(a for a, _ in waited)
    end = max(b for _, b in waited)
    made = sum(tokens_made(r, start, end) for r in done)
    return {"saturated_tokens_s": made / (end - start), "saturated_window_s": end - start}
