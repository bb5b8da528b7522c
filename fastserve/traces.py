"""Request traces for benchmarks: arrival times and token lengths, from files.

``load_trace`` reads one of three formats and returns ``TraceRequest``s sorted by arrival,
the first at 0 s:

- ``azure``: the Azure LLM inference traces, CSV ``TIMESTAMP,ContextTokens,GeneratedTokens``
  (timestamps like ``2023-11-16 18:15:46.6805900``, or plain seconds). Real arrival times,
  made relative to the first; ``rate`` rescales them so that the mean rate is ``rate``. Asked
  for ``arrivals`` explicitly, the timestamps are replaced by synthesized ones at ``rate``
  (default: the trace's own mean rate): its lengths with Poisson or Gamma arrivals.
- ``sharegpt``: CSV ``num_prefill_tokens,num_decode_tokens,...``: lengths only, so arrivals are
  synthesized at ``rate`` (required): Poisson (exponential gaps) or Gamma gaps with the given
  coefficient of variation (``cv`` > 1 is burstier than Poisson).
- ``jsonl``: one object a line, ``{"arrival_s": .., "input_tokens": .., "output_tokens": ..}``;
  without ``arrival_s`` on every line it is lengths-only, like ``sharegpt``.

The mean rate of a trace is (requests - 1) / (last arrival - first arrival), i.e. one over the
mean gap. Lengths are divided by ``length_scale`` (rounded, at least 1) and then capped at
``max_input`` / ``max_output``. ``num_requests`` takes the first N requests, or repeats a
shorter trace, each copy shifted by the trace's span plus one mean gap (which keeps the rate).
Bad files and values raise ``ValueError`` naming the file, line and field.
"""

from __future__ import annotations

import csv
import json
import math
import pathlib
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any

import numpy as np

__all__ = ["FORMATS", "TraceRequest", "describe", "detect_format", "load_trace"]

FORMATS = ("azure", "sharegpt", "jsonl")
ARRIVALS = ("poisson", "gamma")
_AZURE_FIELDS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")
_SHAREGPT_FIELDS = ("num_prefill_tokens", "num_decode_tokens")


@dataclass(frozen=True)
class TraceRequest:
    """One request of a trace: when it arrives (s from the first) and its token lengths."""

    arrival_s: float
    input_tokens: int
    output_tokens: int


@dataclass
class _Rows:
    """What a file holds: lengths, and arrival times (s, absolute) when it has them."""

    inputs: list[int]
    outputs: list[int]
    times: list[float] | None


def detect_format(path: str | pathlib.Path) -> str:
    """The format of ``path``: from its extension (.jsonl, .ndjson) or its CSV header."""
    path = pathlib.Path(path)
    if path.suffix.lower() in (".jsonl", ".ndjson"):
        return "jsonl"
    try:
        with open(path, newline="") as f:
            first = f.readline().strip()
    except OSError as e:
        raise ValueError(f"{path}: cannot read the trace: {e}") from e
    if first.startswith("{"):
        return "jsonl"
    header = [h.strip() for h in first.split(",")]
    if all(h in header for h in _AZURE_FIELDS):
        return "azure"
    if all(h in header for h in _SHAREGPT_FIELDS):
        return "sharegpt"
    raise ValueError(
        f"{path}:1: unknown trace format (header {first[:120]!r}); expected a CSV with columns "
        f"{','.join(_AZURE_FIELDS)} (azure) or {','.join(_SHAREGPT_FIELDS)} (sharegpt), or a "
        ".jsonl file")


def load_trace(
    path: str | pathlib.Path, *, fmt: str | None = None, rate: float | None = None,
    arrivals: str | None = None, cv: float = 1.0, length_scale: float = 1.0,
    max_input: int | None = None, max_output: int | None = None,
    num_requests: int | None = None, seed: int = 0,
) -> list[TraceRequest]:
    """Read the trace at ``path``; see the module doc for the formats and options.

    ``arrivals`` None: the trace's timestamps when it has them, else Poisson; "poisson" or
    "gamma": synthesized, whatever the file holds."""
    path = pathlib.Path(path)
    _check_options(path, fmt, rate, arrivals, cv, length_scale, max_input, max_output,
                   num_requests)
    fmt = fmt or detect_format(path)
    if fmt == "azure":
        rows = _read_azure(path)
    elif fmt == "sharegpt":
        rows = _read_sharegpt(path)
    else:
        rows = _read_jsonl(path)
    n_file = len(rows.inputs)
    if n_file == 0:
        raise ValueError(f"{path}: the trace has no requests")
    n = num_requests or n_file

    inputs = np.array(rows.inputs, dtype=np.float64)
    outputs = np.array(rows.outputs, dtype=np.float64)
    if rows.times is not None:
        times = np.array(rows.times, dtype=np.float64)
        order = np.argsort(times, kind="stable")
        times, inputs, outputs = times[order] - times[order[0]], inputs[order], outputs[order]
        times, inputs, outputs = times[:n], inputs[:n], outputs[:n]
        arrival = _timestamps(path, times, n, rate)
        if arrivals is not None:  # its lengths, in its order, with synthesized arrivals
            own = (n - 1) / float(arrival[-1]) if n > 1 and arrival[-1] > 0 else 1.0
            arrival = _synthesize(n, rate or own, arrivals, cv, seed)
    else:
        if rate is None:
            raise ValueError(f"{path}: this {fmt} trace has no arrival times; give a rate "
                             "(requests/s) to synthesize Poisson or Gamma arrivals")
        arrival = _synthesize(n, rate, arrivals or "poisson", cv, seed)
    reps = -(-n // len(inputs))
    inputs = np.tile(inputs, reps)[:n]
    outputs = np.tile(outputs, reps)[:n]
    inputs = _scale(inputs, length_scale, max_input)
    outputs = _scale(outputs, length_scale, max_output)
    return [TraceRequest(float(a), int(i), int(o)) for a, i, o in zip(arrival, inputs, outputs)]


def describe(trace: list[TraceRequest]) -> dict:
    """Count, input/output token statistics and the mean arrival rate of ``trace``."""
    if not trace:
        return {"count": 0}
    arr = np.array([r.arrival_s for r in trace])
    inp = np.array([r.input_tokens for r in trace], dtype=np.float64)
    out = np.array([r.output_tokens for r in trace], dtype=np.float64)
    span = float(arr.max() - arr.min())
    gaps = np.diff(np.sort(arr))
    return {
        "count": len(trace),
        "mean_input_tokens": float(inp.mean()),
        "p99_input_tokens": float(np.percentile(inp, 99)),
        "max_input_tokens": int(inp.max()),
        "mean_output_tokens": float(out.mean()),
        "p99_output_tokens": float(np.percentile(out, 99)),
        "max_output_tokens": int(out.max()),
        "span_s": span,
        "mean_rate": (len(trace) - 1) / span if span > 0 else None,
        "interarrival_cv": (float(gaps.std() / gaps.mean())
                            if len(gaps) > 1 and gaps.mean() > 0 else None),
    }


def _check_options(path, fmt, rate, arrivals, cv, length_scale, max_input, max_output,
                   num_requests) -> None:  # type: ignore[no-untyped-def]
    def bad(what: str) -> ValueError:
        return ValueError(f"{path}: {what}")

    if fmt is not None and fmt not in FORMATS:
        raise bad(f"trace format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    if rate is not None and not (rate > 0 and math.isfinite(rate)):
        raise bad(f"rate must be > 0 requests/s, got {rate!r}")
    if arrivals is not None and arrivals not in ARRIVALS:
        raise bad(f"arrivals must be one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    if not (cv > 0 and math.isfinite(cv)):
        raise bad(f"cv must be > 0, got {cv!r}")
    if not (length_scale > 0 and math.isfinite(length_scale)):
        raise bad(f"length_scale must be > 0, got {length_scale!r}")
    for name, value in (("max_input", max_input), ("max_output", max_output),
                        ("num_requests", num_requests)):
        if value is not None and value < 1:
            raise bad(f"{name} must be >= 1, got {value!r}")


def _timestamps(path: pathlib.Path, times: np.ndarray, n: int, rate: float | None) -> np.ndarray:
    """Relative, sorted ``times`` (first 0) repeated up to ``n``, then rescaled to ``rate``."""
    span = float(times[-1])
    if n > len(times):
        if len(times) > 1 and span > 0:
            gap = span / (len(times) - 1)
        elif rate is not None:
            gap = 1.0  # copies at equal intervals; the rescale below sets the rate
        else:
            raise ValueError(f"{path}: the trace spans no time, so it cannot be repeated to "
                             f"{n} requests without a rate")
        reps = -(-n // len(times))
        shifts = np.repeat(np.arange(reps) * (span + gap), len(times))
        times = (np.tile(times, reps) + shifts)[:n]
    if rate is not None and len(times) > 1:
        span = float(times[-1])
        if span <= 0:
            raise ValueError(f"{path}: all {len(times)} requests arrive at the same time, so "
                             "the trace cannot be rescaled to a rate")
        times = times * ((len(times) - 1) / span) / rate
    return times


def arrival_times(n: int, rate: float, arrivals: str = "poisson", cv: float = 1.0,
                  seed: int = 0) -> np.ndarray:
    """``n`` synthesized arrival times from 0, for workloads without timestamps (as a trace
    without them gets): Poisson, or Gamma gaps of coefficient of variation ``cv``."""
    if not (rate > 0 and math.isfinite(rate)):
        raise ValueError(f"rate must be > 0 requests/s, got {rate!r}")
    if arrivals not in ARRIVALS:
        raise ValueError(f"arrivals must be one of {', '.join(ARRIVALS)}, got {arrivals!r}")
    if not (cv > 0 and math.isfinite(cv)):
        raise ValueError(f"cv must be > 0, got {cv!r}")
    return _synthesize(n, rate, arrivals, cv, seed)


def _synthesize(n: int, rate: float, arrivals: str, cv: float, seed: int) -> np.ndarray:
    """``n`` arrival times from 0 with mean gap 1/rate: exponential or Gamma(cv) gaps."""
    rng = np.random.default_rng(seed)
    if arrivals == "poisson":
        gaps = rng.exponential(1.0 / rate, size=n - 1)
    else:
        shape = 1.0 / (cv * cv)
        gaps = rng.gamma(shape, 1.0 / (rate * shape), size=n - 1)
    return np.concatenate([[0.0], np.cumsum(gaps)])


def _scale(lengths: np.ndarray, scale: float, cap: int | None) -> np.ndarray:
    out = np.maximum(1, np.rint(lengths / scale)).astype(np.int64)
    return np.minimum(out, cap) if cap is not None else out


def _int_field(path: pathlib.Path, line: int, field: str, value: object) -> int:
    """A non-negative integer token count (``12`` or ``12.0``), or a ValueError naming it."""
    x: object = value
    if isinstance(value, str):
        try:
            x = float(value)
        except ValueError:
            x = None
    if (isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x)
            or not float(x).is_integer() or x < 0):
        raise ValueError(f"{path}:{line}: field {field!r} must be a non-negative integer, "
                         f"got {value!r}")
    return int(x)


def _time_field(path: pathlib.Path, line: int, field: str, value: object) -> float:
    """Seconds: a number, or a timestamp like ``2023-11-16 18:15:46.6805900``."""
    t = _seconds(value)
    if t is None or not math.isfinite(t):
        raise ValueError(f"{path}:{line}: field {field!r} must be a timestamp "
                         f"(seconds, or like 2023-11-16 18:15:46.68), got {value!r}")
    return t


def _seconds(value: object) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    # fromisoformat before Python 3.11 takes neither 7 fractional digits nor 'Z'.
    main, _, frac = text.removesuffix("Z").partition(".")
    if frac and not frac.isdigit():
        return None
    try:
        dt = datetime.fromisoformat(main)
    except ValueError:
        return None
    if dt.tzinfo is None:  # wall clock: read as UTC, so no DST jumps
        dt = dt.replace(tzinfo=timezone.utc)
    return dt.timestamp() + (float("0." + frac) if frac else 0.0)


def _lines(path: pathlib.Path, what: str = "the trace") -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"{path}: cannot read {what}: {e}") from e


def json_lines(path: str | pathlib.Path,
               what: str = "the trace") -> Iterator[tuple[int, str, Any]]:
    """(line number, text, parsed value) of every non-blank line of a JSONL file; a file that
    cannot be read, or a line that is not JSON, is a ValueError naming it."""
    path = pathlib.Path(path)
    for line, text in enumerate(_lines(path, what), 1):
        if not text.strip():
            continue
        try:
            value = json.loads(text)
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{line}: not valid JSON: {e.msg}") from None
        yield line, text, value


def _read_csv(path: pathlib.Path, fields: tuple[str, ...]):  # type: ignore[no-untyped-def]
    """Yield (line number, {field: text}) for each data row, checking the header."""
    reader = csv.reader(_lines(path))
    header = [h.strip() for h in next(reader, [])]
    missing = [h for h in fields if h not in header]
    if missing:
        raise ValueError(f"{path}:1: the header lacks column(s) {', '.join(missing)} "
                         f"(header: {','.join(header)})")
    index = {h: header.index(h) for h in fields}
    for row in reader:
        if not row or all(not c.strip() for c in row):
            continue
        if len(row) < len(header):
            raise ValueError(f"{path}:{reader.line_num}: expected {len(header)} fields, "
                             f"got {len(row)}")
        yield reader.line_num, {h: row[i] for h, i in index.items()}


def _read_azure(path: pathlib.Path) -> _Rows:
    rows = _Rows([], [], [])
    for line, r in _read_csv(path, _AZURE_FIELDS):
        rows.times.append(_time_field(path, line, "TIMESTAMP", r["TIMESTAMP"]))  # type: ignore
        rows.inputs.append(_int_field(path, line, "ContextTokens", r["ContextTokens"]))
        rows.outputs.append(_int_field(path, line, "GeneratedTokens", r["GeneratedTokens"]))
    return rows


def _read_sharegpt(path: pathlib.Path) -> _Rows:
    rows = _Rows([], [], None)
    for line, r in _read_csv(path, _SHAREGPT_FIELDS):
        rows.inputs.append(_int_field(path, line, "num_prefill_tokens", r["num_prefill_tokens"]))
        rows.outputs.append(_int_field(path, line, "num_decode_tokens", r["num_decode_tokens"]))
    return rows


def _read_jsonl(path: pathlib.Path) -> _Rows:
    rows = _Rows([], [], [])
    timed: bool | None = None
    for line, text, obj in json_lines(path):
        if not isinstance(obj, dict):
            raise ValueError(  # not TypeError: a bad file, not a bad argument
                f"{path}:{line}: expected a JSON object, got {text.strip()!r}")
        for field in ("input_tokens", "output_tokens"):
            if field not in obj:
                raise ValueError(f"{path}:{line}: field {field!r} is missing")
        has_time = "arrival_s" in obj
        if timed is None:
            timed = has_time
        elif timed != has_time:
            raise ValueError(f"{path}:{line}: field 'arrival_s' must be on every line or "
                             "on none")
        if has_time:
            t = obj["arrival_s"]
            if isinstance(t, str) or _time_field(path, line, "arrival_s", t) < 0:
                raise ValueError(f"{path}:{line}: field 'arrival_s' must be a number of "
                                 f"seconds >= 0, got {t!r}")
            rows.times.append(float(t))  # type: ignore[union-attr]
        rows.inputs.append(_int_field(path, line, "input_tokens", obj["input_tokens"]))
        rows.outputs.append(_int_field(path, line, "output_tokens", obj["output_tokens"]))
    if not timed:
        rows.times = None
    return rows
