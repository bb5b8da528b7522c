"""Answers with their tokens and the shipped probe's estimates at every refresh (issue 12).

For the loop study (``docs/benchmarks.md``, "Answers that loop"): each prompt is answered on an
in-process engine with the default model's shipped predictor as its probe, at the serving
settings (temperature 0.2, top-p 0.9, cap 512, one seed per prompt), and for each answer the
script keeps its output tokens, why it ended (end-of-sequence or the cap) and the probe's
estimate of the tokens still to come at each refresh (after 1, 17, 33, ... tokens), without
the worker's loop check (``analyze.py`` applies it).

Usage (from the repository root; about 3 minutes per 96 prompts on 2 cores):
    python docs/bench-predictive/loops/collect.py --split train --limit 96 --out train.json
    python docs/bench-predictive/loops/collect.py --split heldout --out heldout.json
"""

from __future__ import annotations

import argparse
import json
import math
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))

PROMPTS = ROOT.parent / "shared" / "prompts" / "instructions.jsonl"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--split", choices=("train", "heldout"), required=True,
                   help="the predictor's training or held-out instructions (holdout 0.2, by "
                   "a hash of the text, as `fastserve predictor train` splits them)")
    p.add_argument("--limit", type=int, default=None, help="the first N of the split")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--max-tokens", type=int, default=512)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--out", required=True)
    args = p.parse_args()

    from tqdm import tqdm

    from fastserve.bench.prompts import load_instructions
    from fastserve.models import resolve_model
    from fastserve.predictor.collect import chat_engine
    from fastserve.predictor.split import split
    from worker_svc.engine import JobCommand, NewJob, StepCommand
    from worker_svc.predictor import LengthPredictor, find_artifact
    from worker_svc.sampler import SamplingParams

    texts = load_instructions(str(PROMPTS))
    train, test = split(texts, 0.2)
    chosen = (train if args.split == "train" else test)[:args.limit]
    loaded, prompts, eos = chat_engine("SmolLM2-135M-Instruct", [texts[i] for i in chosen],
                                       max_tokens=args.max_tokens, batch_size=args.batch_size)
    engine = loaded.engine
    spec = loaded.spec
    artifact = find_artifact(resolve_model("SmolLM2-135M-Instruct"))
    assert artifact is not None, "no predictor for the default model"
    # The probe's own estimates: the loop check is what analyze.py adds.
    engine.probe = LengthPredictor.load(artifact, spec.hidden_size, spec.num_layers,
                                        loop_ngram=0)
    bs = engine.pool.block_size
    free = list(range(engine.pool.config.num_blocks))
    queue = list(range(len(prompts)))[::-1]
    running: dict[int, list[int]] = {}
    estimates: dict[int, list[tuple[int, float]]] = {}
    blocks: dict[int, list[int]] = {}
    answers: list[dict] = [{} for _ in prompts]
    bar = tqdm(total=len(prompts), desc="answering", unit="prompt", file=sys.stderr)
    while queue or running:
        cmd = StepCommand()
        for jid in running:
            cmd.commands.append(JobCommand(jid, 1))
        while queue and len(running) < args.batch_size:
            jid = queue.pop()
            need = math.ceil((len(prompts[jid]) + args.max_tokens) / bs)
            blocks[jid], free = free[:need], free[need:]
            sampling = SamplingParams(0.2, 0.9, 0, 1_000_003 * args.seed + chosen[jid])
            cmd.new_jobs.append(NewJob(jid, list(prompts[jid]), sampling, blocks[jid]))
            cmd.commands.append(JobCommand(jid, len(prompts[jid])))
            running[jid], estimates[jid] = [], []
        result = engine.step(cmd)
        if result.errors:
            raise RuntimeError(f"engine error: {result.errors[0]}")
        for r in result.results:
            out = running[r.job_id]
            out.append(r.token_id)
            if r.predicted_remaining is not None:
                estimates[r.job_id].append((len(out), r.predicted_remaining))
            if r.token_id in eos or len(out) >= args.max_tokens:
                answers[r.job_id] = {
                    "index": chosen[r.job_id], "prompt_tokens": len(prompts[r.job_id]),
                    "tokens": out, "capped": r.token_id not in eos,
                    "estimates": estimates.pop(r.job_id)}
                del running[r.job_id]
                engine.step(StepCommand(free_job_ids=[r.job_id]))
                free.extend(blocks.pop(r.job_id))
                bar.update(1)
    bar.close()
    pathlib.Path(args.out).write_text(json.dumps(
        {"split": args.split, "seed": args.seed, "max_tokens": args.max_tokens,
         "answers": answers}) + "\n")
    capped = sum(a["capped"] for a in answers)
    print(f"{len(answers)} answers, {capped} at the cap, written to {args.out}")


if __name__ == "__main__":
    main()
