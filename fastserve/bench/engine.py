"""`fastserve bench engine`: this engine against transformers generate().

Decode tokens/s per batch size and prefill tokens/s, both systems on the same model, device and
prompts; greedy tokens are compared as a sanity check (mismatching rows counted, never fatal).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time

import numpy as np

SEED = 1234
PAD_ID = 0  # prompts never contain it, so transformers' right-padding check stays quiet
BLOCK_SIZE = 16


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("engine", help="decode and prefill throughput vs transformers")
    p.add_argument("--model", default=None, help="model (default: the default model)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    p.add_argument("--batch-sizes", default="1,8,32", type=_int_list,
                   help="comma-separated decode batch sizes")
    p.add_argument("--decode-tokens", type=int, default=32, help="timed decode iterations")
    p.add_argument("--prompt-len", type=int, default=64,
                   help="mean decode prompt length (uniform in [len/2, len*3/2])")
    p.add_argument("--prefill-len", type=int, default=512)
    p.add_argument("--prefill-batch", type=int, default=4)
    p.add_argument("--repeats", type=int, default=1, help="timed repeats; the best is kept")
    p.add_argument("--json", default=None, metavar="OUT", help="write the figures as JSON")
    p.add_argument("--skip-transformers", action="store_true", help="time only this engine")
    p.set_defaults(func=run)


def _int_list(text: str) -> list[int]:
    values = [int(x) for x in text.split(",") if x.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _warn(msg: str) -> None:
    from tqdm.auto import tqdm

    tqdm.write(f"warning: {msg}", file=sys.stderr)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def make_prompts(vocab_size: int, batch: int, mean_len: int, exact: bool = False
                 ) -> list[list[int]]:
    """Deterministic random prompts (token ids in [1, vocab)); lengths vary around mean_len."""
    rng = np.random.default_rng([SEED, batch, mean_len, int(exact)])
    lo, hi = max(1, mean_len // 2), max(1, mean_len * 3 // 2)
    lengths = [mean_len] * batch if exact else rng.integers(lo, hi + 1, size=batch).tolist()
    return [rng.integers(1, vocab_size, size=n).tolist() for n in lengths]


# --- this engine ------------------------------------------------------------------------------

class _Jobs:
    """Hands out job ids and block ids (every measurement frees its jobs again)."""

    def __init__(self, engine):
        self.engine, self.next_id = engine, 0

    def new(self, prompts: list[list[int]], total_tokens: list[int]) -> list:
        from worker_svc.engine import NewJob

        jobs, block = [], 0
        for p, total in zip(prompts, total_tokens):
            n = math.ceil(total / BLOCK_SIZE)
            jobs.append(NewJob(self.next_id, p, block_ids=list(range(block, block + n))))
            self.next_id, block = self.next_id + 1, block + n
        return jobs

    def step(self, **kw):
        from worker_svc.engine import StepCommand

        out = self.engine.step(StepCommand(**kw))
        if out.errors:
            raise RuntimeError(f"engine step failed: {out.errors[0]}")
        return out


def _engine_generate(jobs: _Jobs, prompts: list[list[int]], decode_tokens: int
                     ) -> tuple[list[list[int]], float, float]:
    """Prefill in one step, then ``decode_tokens`` decode steps; tokens and both step times."""
    from worker_svc.engine import JobCommand

    new = jobs.new(prompts, [len(p) + decode_tokens + 1 for p in prompts])
    dev = jobs.engine.device.type
    try:
        _sync(dev)
        start = time.perf_counter()
        out = jobs.step(new_jobs=new, commands=[JobCommand(j.job_id, len(j.prompt_token_ids))
                                                for j in new])
        _sync(dev)
        prefill_end = time.perf_counter()
        tokens = {r.job_id: [r.token_id] for r in out.results}
        decode = [JobCommand(j.job_id, 1) for j in new]
        for _ in range(decode_tokens):
            for r in jobs.step(commands=decode).results:
                tokens[r.job_id].append(r.token_id)
        _sync(dev)
        end = time.perf_counter()
    finally:
        jobs.step(free_job_ids=[j.job_id for j in new])
    return [tokens[j.job_id] for j in new], prefill_end - start, end - prefill_end


def bench_engine_decode(jobs: _Jobs, prompts: list[list[int]], decode_tokens: int,
                        repeats: int) -> tuple[float, list[list[int]]]:
    _engine_generate(jobs, prompts, min(2, decode_tokens))  # warm-up
    runs = [_engine_generate(jobs, prompts, decode_tokens) for _ in range(repeats)]
    return len(prompts) * decode_tokens / min(r[2] for r in runs), runs[0][0]


def bench_engine_prefill(jobs: _Jobs, prompts: list[list[int]], repeats: int
                         ) -> tuple[float, list[list[int]]]:
    _engine_generate(jobs, prompts, 0)  # warm-up
    runs = [_engine_generate(jobs, prompts, 0) for _ in range(repeats)]
    return sum(map(len, prompts)) / min(r[1] for r in runs), runs[0][0]


# --- transformers -----------------------------------------------------------------------------

def _hf_generate(model, prompts: list[list[int]], new_tokens: int, device: str
                 ) -> tuple[list[list[int]], float]:
    import torch

    width = max(map(len, prompts))
    ids = torch.full((len(prompts), width), PAD_ID, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):  # left padding
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    ids, mask = ids.to(device), mask.to(device)
    _sync(device)
    start = time.perf_counter()
    # eos_token_id=None: pure greedy for the full length, like the engine (min_new_tokens would
    # otherwise suppress eos, which the engine does not).
    out = model.generate(input_ids=ids, attention_mask=mask, do_sample=False,
                         max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                         eos_token_id=None, pad_token_id=PAD_ID)
    _sync(device)
    elapsed = time.perf_counter() - start
    return out[:, width:].tolist(), elapsed


def bench_hf_decode(model, prompts: list[list[int]], decode_tokens: int, repeats: int,
                    device: str) -> tuple[float | None, list[list[int]]]:
    """Decode time = generate(decode_tokens + 1) - generate(1); None if noise made it <= 0."""
    _hf_generate(model, prompts, min(2, decode_tokens) + 1, device)  # warm-up
    # the prefill-only run is cheap: a few more tries keep a noisy one from eating the difference
    prefill = min(_hf_generate(model, prompts, 1, device)[1] for _ in range(max(3, repeats)))
    runs = [_hf_generate(model, prompts, decode_tokens + 1, device) for _ in range(repeats)]
    decode_time = min(t for _, t in runs) - prefill
    if decode_time <= 0:
        _warn(f"transformers decode time at batch {len(prompts)} not measurable (noise); "
              "try more --decode-tokens or --repeats")
        return None, runs[0][0]
    return len(prompts) * decode_tokens / decode_time, runs[0][0]


def bench_hf_prefill(model, prompts: list[list[int]], repeats: int, device: str
                     ) -> tuple[float, list[list[int]]]:
    _hf_generate(model, prompts, 1, device)  # warm-up
    runs = [_hf_generate(model, prompts, 1, device) for _ in range(repeats)]
    return sum(map(len, prompts)) / min(t for _, t in runs), runs[0][0]


def _load_hf(path: str, dtype: str, device: str):
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as tf_logging

    from worker_svc.loader import DTYPES

    tf_logging.set_verbosity_error()  # generation-flag notices from the model's defaults
    model = AutoModelForCausalLM.from_pretrained(path, dtype=DTYPES[dtype],
                                                 attn_implementation="sdpa")
    return model.to(device).eval()


# --- driver -----------------------------------------------------------------------------------

def _fmt(x: float | None) -> str:
    return "-" if x is None else f"{x:,.1f}"


def report(results: dict, config: dict, mismatches: tuple[int, int] | None) -> str:
    eng, hf = results["engine"], results["transformers"]
    lines = [(f"model {config['model']}  device {config['device']}  dtype {config['dtype']}  "
              f"threads {config['threads']}"),
             f"{'metric':<28}{'engine':>12}{'transformers':>15}{'ratio':>9}"]
    rows = [(f"decode tok/s  batch {b}", eng["decode_tokens_s"][b],
             hf and hf["decode_tokens_s"][b]) for b in eng["decode_tokens_s"]]
    rows.append((f"prefill tok/s ({config['prefill_len']} x {config['prefill_batch']})",
                 eng["prefill_tokens_s"], hf and hf["prefill_tokens_s"]))
    for name, e, h in rows:
        ratio = f"{e / h:.2f}x" if h else "-"
        lines.append(f"{name:<28}{_fmt(e):>12}{_fmt(h):>15}{ratio:>9}")
    lines.append("greedy token mismatches: " + ("n/a (transformers skipped)" if mismatches is None
                 else f"{mismatches[0]} of {mismatches[1]} rows"))
    return "\n".join(lines)


def _measure_one(args, jobs: _Jobs, hf, prompts: list[list[int]], kind: str, bar):
    """One measurement for both systems: (engine tok/s, transformers tok/s, mismatched rows)."""
    if kind == "decode":
        rate, toks = bench_engine_decode(jobs, prompts, args.decode_tokens, args.repeats)
    else:
        rate, toks = bench_engine_prefill(jobs, prompts, args.repeats)
    bar.update()
    if hf is None:
        return rate, None, 0
    if kind == "decode":
        ref, ref_toks = bench_hf_decode(hf, prompts, args.decode_tokens, args.repeats,
                                        args.device)
    else:
        ref, ref_toks = bench_hf_prefill(hf, prompts, args.repeats, args.device)
    bar.update()
    return rate, ref, sum(a != b for a, b in zip(toks, ref_toks))


def _measure(args, jobs: _Jobs, hf, vocab: int, bar) -> tuple[dict, int, int]:
    """Run every measurement; return results, mismatching rows and compared rows."""
    eng = {"decode_tokens_s": {}, "prefill_tokens_s": None}
    ref = {"decode_tokens_s": {}, "prefill_tokens_s": None}
    mism = rows = 0
    for b in args.batch_sizes:
        bar.set_description(f"decode batch {b}")
        prompts = make_prompts(vocab, b, args.prompt_len)
        e, h, m = _measure_one(args, jobs, hf, prompts, "decode", bar)
        eng["decode_tokens_s"][str(b)], ref["decode_tokens_s"][str(b)] = e, h
        mism, rows = mism + m, rows + b
    bar.set_description(f"prefill batch {args.prefill_batch}")
    prompts = make_prompts(vocab, args.prefill_batch, args.prefill_len, exact=True)
    eng["prefill_tokens_s"], ref["prefill_tokens_s"], m = _measure_one(
        args, jobs, hf, prompts, "prefill", bar)
    return ({"engine": eng, "transformers": None if hf is None else ref}, mism + m,
            rows + args.prefill_batch)


def run(args: argparse.Namespace) -> int:
    import torch
    import transformers
    from tqdm.auto import tqdm

    from fastserve.models import DEFAULT_MODEL
    from worker_svc.loader import EngineConfig, load_engine

    if min(args.decode_tokens, args.prompt_len, args.prefill_len, args.prefill_batch,
           args.repeats) < 1:
        raise SystemExit("--decode-tokens, --prompt-len, --prefill-len, --prefill-batch and "
                         "--repeats must be >= 1")
    model_arg = args.model or DEFAULT_MODEL
    longest = max(args.prompt_len * 3 // 2 + args.decode_tokens + 1, args.prefill_len + 1)
    blocks = max(max(args.batch_sizes) * math.ceil(longest / BLOCK_SIZE),
                 args.prefill_batch * math.ceil((args.prefill_len + 1) / BLOCK_SIZE))
    with torch.inference_mode():
        loaded = load_engine(EngineConfig(model_arg, device=args.device, dtype=args.dtype,
                                          num_blocks=blocks, block_size=BLOCK_SIZE))
        if longest > loaded.engine.max_context:
            raise SystemExit(f"prompts need {longest} positions; the model allows "
                             f"{loaded.engine.max_context}")
        hf = None if args.skip_transformers else _load_hf(loaded.model_path, args.dtype,
                                                          args.device)
        config = {"model": model_arg, "model_path": loaded.model_path, "device": args.device,
                  "dtype": args.dtype, "threads": torch.get_num_threads(),
                  "torch": torch.__version__, "transformers": transformers.__version__,
                  "batch_sizes": args.batch_sizes, "decode_tokens": args.decode_tokens,
                  "prompt_len": args.prompt_len,
                  "prompt_len_range": [max(1, args.prompt_len // 2), args.prompt_len * 3 // 2],
                  "prefill_len": args.prefill_len, "prefill_batch": args.prefill_batch,
                  "repeats": args.repeats, "seed": SEED}
        total = (len(args.batch_sizes) + 1) * (1 if hf is None else 2)
        with tqdm(total=total, file=sys.stderr, unit="run") as bar:
            results, mism, rows = _measure(args, _Jobs(loaded.engine), hf,
                                           loaded.spec.vocab_size, bar)
    print(report(results, config, None if hf is None else (mism, rows)), flush=True)
    if args.json:
        doc = {**results, "config": config, "greedy_mismatched_rows": None if hf is None else mism,
               "greedy_compared_rows": None if hf is None else rows}
        with open(args.json, "w") as fh:
            fh.write(json.dumps(doc, indent=2) + "\n")
    return 0
