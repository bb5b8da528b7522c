"""``fastserve predictor train``: generate answers to prompts, fit the length probe, cache it.

Stages, each reported on stderr:

1. split the prompt file (``split.py``): the held-out instructions are never trained on;
2. generate every prompt's answers (``--samples`` of them, each with its own seed) with the
   serving settings (chat message, temperature, top-p, the cap) on an in-process engine,
   recording hidden states of the candidate layers (``collect.py``); the recording is saved
   to ``--data`` and reused when it matches, since this is the slow stage;
3. fit one probe per candidate layer on the training prompts, choose the layer by its error on
   a validation slice of them, refit, and report the error on the held-out prompts
   (``fit.py``);
4. write the artifact where the worker looks for it (``worker_svc.predictor.artifact_path``)
   or to ``--out``, and print the held-out figures as JSON on stdout.
"""

from __future__ import annotations

import argparse
import json
import logging
import pathlib
import sys

log = logging.getLogger(__name__)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("predictor", help="the output-length predictor")
    psub = p.add_subparsers(dest="predictor_command", required=True)
    t = psub.add_parser("train", help="generate answers to prompts and fit the length probe")
    t.add_argument("--model", default="SmolLM2-135M-Instruct")
    t.add_argument("--prompts", required=True, help="JSONL with an 'instruction' per line")
    t.add_argument("--holdout", type=float, default=0.2,
                   help="fraction of instructions held out (by a hash of their text)")
    t.add_argument("--max-tokens", type=int, default=512)
    t.add_argument("--temperature", type=float, default=0.2)
    t.add_argument("--top-p", type=float, default=0.9)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--samples", type=int, default=1,
                   help="answers generated per prompt, each with its own seed: the same "
                        "prompt's answers vary in length, and more of them teach the probe "
                        "the expected length rather than one draw")
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--layers", default="auto",
                   help="candidate layers, comma-separated (auto: quarters of the depth)")
    t.add_argument("--refresh", type=int, default=16,
                   help="predict at the first token and every N generated tokens after")
    t.add_argument("--device", default="cpu")
    t.add_argument("--data", default=None,
                   help="where the recorded generations are kept and reused (.pt)")
    t.add_argument("--out", default=None, help="artifact path (default: the model's cache)")
    t.add_argument("--heldout-out", default=None,
                   help="also write the held-out instructions here (JSONL), for benchmarks")
    t.add_argument("--no-progress", action="store_true")
    t.set_defaults(func=_train)


def _layers(text: str, num_layers: int) -> list[int]:
    if text == "auto":
        return sorted({max(0, num_layers * q // 4 - 1) for q in (1, 2, 3, 4)})
    try:
        layers = sorted({int(x) for x in text.split(",")})
    except ValueError:
        raise SystemExit(f"--layers: expected comma-separated integers, got {text!r}") from None
    bad = [x for x in layers if not 0 <= x < num_layers]
    if bad:
        raise SystemExit(f"--layers: {bad} outside [0, {num_layers})")
    return layers


def _train(args: argparse.Namespace) -> int:
    import torch

    from fastserve.bench.prompts import load_instructions
    from fastserve.predictor import fit
    from fastserve.predictor.collect import answer_sampling, chat_engine, collect_answers
    from fastserve.predictor.split import split
    from worker_svc.predictor import FORMAT, artifact_path

    if min(args.max_tokens, args.batch_size, args.refresh, args.samples) < 1:
        raise SystemExit("--max-tokens, --batch-size, --refresh and --samples must be >= 1")
    progress = not args.no_progress
    instructions = load_instructions(args.prompts)
    train_idx, test_idx = split(instructions, args.holdout)
    print(f"{len(train_idx)} training and {len(test_idx)} held-out instructions",
          file=sys.stderr)
    if args.heldout_out:
        with open(args.heldout_out, "w") as f:
            for i in test_idx:
                f.write(json.dumps({"instruction": instructions[i]}) + "\n")
    settings = {"model": args.model, "prompts": list(instructions),
                "max_tokens": args.max_tokens, "temperature": args.temperature,
                "top_p": args.top_p, "seed": args.seed, "refresh": args.refresh,
                "samples": args.samples}
    data = None
    if args.data and pathlib.Path(args.data).is_file():
        data = torch.load(args.data, weights_only=True)
        if data.get("settings") != settings:
            print(f"{args.data} was recorded with other settings; generating again",
                  file=sys.stderr)
            data = None
    if data is None:
        loaded, prompts, eos = chat_engine(args.model, instructions, max_tokens=args.max_tokens,
                                           batch_size=args.batch_size, device=args.device)
        layers = _layers(args.layers, loaded.spec.num_layers)
        samples, lengths = collect_answers(
            loaded.engine, prompts,
            sampling=answer_sampling(len(prompts), args.samples, args.temperature,
                                     args.top_p, args.seed),
            eos=eos, max_tokens=args.max_tokens, batch_size=args.batch_size,
            layers=layers, refresh=args.refresh, progress=progress)
        feats, prompt_index, generated, remaining = samples.tensors()
        data = {"settings": settings, "layers": layers, "feats": feats,
                "prompt_index": prompt_index, "generated": generated, "remaining": remaining,
                "lengths": torch.tensor(lengths),  # [answer k, prompt]
                "hidden_size": loaded.spec.hidden_size, "model_path": loaded.model_path}
        if args.data:
            torch.save(data, args.data)
    result = fit.train(data, train_idx, test_idx, max_tokens=args.max_tokens,
                       progress=progress)
    artifact = {"format": FORMAT, "hidden_size": int(data["hidden_size"]),
                "refresh": args.refresh, **result.weights,
                "info": {"layer": result.layer, "held_out": result.held_out,
                         "num_train_prompts": len(train_idx),
                         "num_held_out_prompts": len(test_idx),
                         "holdout": args.holdout, "temperature": args.temperature,
                         "top_p": args.top_p, "max_tokens": args.max_tokens}}
    out = pathlib.Path(args.out) if args.out else artifact_path(data["model_path"])
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(artifact, out)
    print(f"predictor written to {out}", file=sys.stderr)
    print(json.dumps({"artifact": str(out), "layer": result.layer,
                      "validation": result.validation, "held_out": result.held_out}, indent=2))
    return 0
