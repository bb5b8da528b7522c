"""Whether the sampler draws the same tokens as an earlier version of it, on the default
model's real distributions: each of the first ``--prompts`` held-out instructions (sent as a
user chat message) is answered twice, ``--max-tokens`` tokens at temperature 0.2 / top-p 0.9
(seed = its index), once with ``worker_svc/sampler.py`` as it is and once with the file as it
was at ``--ref`` (a git commit), in one process with one engine; prints the answers that
differ and where they first differ:

    python docs/bench-sampler/same_tokens.py --ref fe14102
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import pathlib
import subprocess
import sys
import tempfile
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


def load_ref(commit: str) -> ModuleType:
    """``worker_svc/sampler.py`` as it was at ``commit``, as a module of its own."""
    src = subprocess.run(["git", "-C", str(ROOT), "show", f"{commit}:worker_svc/sampler.py"],
                         capture_output=True, text=True, check=True).stdout
    with tempfile.TemporaryDirectory() as tmp:
        path = pathlib.Path(tmp) / "sampler_ref.py"
        path.write_text(src)
        spec = importlib.util.spec_from_file_location("sampler_ref", path)
        assert spec and spec.loader
        ref = importlib.util.module_from_spec(spec)
        sys.modules["sampler_ref"] = ref  # its dataclasses look their module up
        spec.loader.exec_module(ref)
    return ref


def main() -> int:
    from transformers import AutoTokenizer

    from fastserve.models import resolve_model
    from worker_svc import engine as engine_mod
    from worker_svc.engine import JobCommand, NewJob, StepCommand
    from worker_svc.loader import EngineConfig, load_engine
    from worker_svc.sampler import SamplingParams

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ref", required=True, help="git commit whose sampler to compare with")
    p.add_argument("--prompts", type=int, default=16)
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--file", default=str(ROOT / "docs/bench-predictive/heldout.jsonl"))
    args = p.parse_args()

    ref = load_ref(args.ref)
    model = "SmolLM2-135M-Instruct"
    tok = AutoTokenizer.from_pretrained(str(resolve_model(model)))
    lines = pathlib.Path(args.file).read_text().splitlines()[:args.prompts]
    prompts = [tok.apply_chat_template([{"role": "user", "content": json.loads(x)["instruction"]}],
                                       add_generation_prompt=True) for x in lines]
    per_job = -(-(max(map(len, prompts)) + args.max_tokens + 1) // 16)
    engine = load_engine(EngineConfig(model, num_blocks=per_job + 1,
                                      max_context=per_job * 16)).engine
    now = engine_mod.sample

    def answer(i: int, prompt: list[int]) -> list[int]:
        params = SamplingParams(temperature=0.2, top_p=0.9, seed=i)
        out = engine.step(StepCommand(
            new_jobs=[NewJob(i, prompt, params, list(range(per_job)))],
            commands=[JobCommand(i, len(prompt))]))
        tokens = [out.results[0].token_id]
        while len(tokens) < args.max_tokens and tokens[-1] != tok.eos_token_id:
            out = engine.step(StepCommand(commands=[JobCommand(i, 1)]))
            tokens.append(out.results[0].token_id)
        engine.step(StepCommand(free_job_ids=[i]))
        return tokens

    differ = 0
    for i, prompt in enumerate(prompts):
        engine_mod.sample = now
        a = answer(i, prompt)
        engine_mod.sample = ref.sample
        b = answer(i, prompt)
        first = next((k for k, (x, y) in enumerate(zip(a, b)) if x != y),
                     None if len(a) == len(b) else min(len(a), len(b)))
        differ += first is not None
        print(f"prompt {i}: {len(a)} / {len(b)} tokens, "
              + ("the same" if first is None else f"first differ at token {first}"), flush=True)
    print(f"{differ} of {len(prompts)} answers differ")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
