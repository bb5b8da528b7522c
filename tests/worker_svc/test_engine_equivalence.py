"""Greedy output of the engine is token-identical to transformers generate().

Eight prompts from 1 to over 500 tokens, run alone, all in one batch, joining and leaving
mid-generation, and with chunked prefill, on a tiny random GQA Llama and on SmolLM2-135M.
"""

from __future__ import annotations

import random

import pytest
import torch
from engine_driver import DriverJob, assert_matches, drive, hf_greedy

from worker_svc.loader import EngineConfig, load_engine

LENGTHS = [1, 3, 17, 40, 100, 200, 333, 530]
ARRIVALS = [0, 0, 2, 3, 5, 8, 9, 13]

TEXT = (
    "The history of the printing press begins in the fifteenth century, when Johannes "
    "Gutenberg combined movable metal type, oil-based ink and a wooden press. Within decades, "
    "printed books spread across Europe, prices fell, literacy rose and ideas travelled faster "
    "than ever before. Scientists shared results, reformers spread pamphlets, and merchants "
    "printed price lists. "
)


class Case:
    def __init__(self, model_dir, prompts, max_tokens):
        from transformers import AutoModelForCausalLM

        self.engine = load_engine(EngineConfig(model=str(model_dir), num_blocks=1024)).engine
        hf = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.prompts = prompts
        self.max_tokens = max_tokens
        self.refs = [hf_greedy(hf, p, max_tokens) for p in prompts]

    def jobs(self, arrivals=None, shorten=False):
        arrivals = arrivals or [0] * len(self.prompts)
        return [
            # Jobs that stop early leave the batch while the others keep going.
            DriverJob(i, p, self.max_tokens - (i % 3) * 4 if shorten else self.max_tokens, a)
            for i, (p, a) in enumerate(zip(self.prompts, arrivals))
        ]

    def check(self, outputs, what):
        for i, ref in enumerate(self.refs):
            got = outputs[i]
            ref_prefix = type(ref)(ref.tokens[: len(got)], ref.logits[: len(got)])
            assert_matches(got, ref_prefix, f"{what}, prompt {i} ({len(self.prompts[i])} tokens)")


@pytest.fixture(scope="module")
def tiny_case(tiny_llama_dir):
    rng = random.Random(1)
    prompts = [[rng.randrange(256) for _ in range(n)] for n in LENGTHS]
    return Case(tiny_llama_dir, prompts, 24)


@pytest.fixture(scope="module")
def smol_case(default_model_dir):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(default_model_dir)
    ids = tok(TEXT * 12).input_ids
    prompts = [ids[i * 7: i * 7 + n] for i, n in enumerate(LENGTHS)]
    assert [len(p) for p in prompts] == LENGTHS
    return Case(default_model_dir, prompts, 16)


CASES = ["tiny_case", pytest.param("smol_case", marks=pytest.mark.slow)]


@pytest.mark.parametrize("case_name", CASES)
def test_each_prompt_alone(case_name, request):
    case = request.getfixturevalue(case_name)
    for job in case.jobs():
        out = drive(case.engine, [job])
        case.check({i: out.get(i, case.refs[i].tokens) for i in range(len(case.prompts))},
                   "alone")


@pytest.mark.parametrize("case_name", CASES)
def test_all_in_one_batch(case_name, request):
    case = request.getfixturevalue(case_name)
    case.check(drive(case.engine, case.jobs()), "one batch")


@pytest.mark.parametrize("case_name", CASES)
def test_jobs_join_and_leave_mid_generation(case_name, request):
    case = request.getfixturevalue(case_name)
    out = drive(case.engine, case.jobs(ARRIVALS, shorten=True), seed=3)
    case.check(out, "interleaved")


@pytest.mark.parametrize("case_name", CASES)
@pytest.mark.parametrize("chunk", [7, 64])
def test_chunked_prefill(case_name, chunk, request):
    case = request.getfixturevalue(case_name)
    out = drive(case.engine, case.jobs(ARRIVALS, shorten=True), chunk=chunk, seed=4)
    case.check(out, f"chunked prefill ({chunk})")


def test_batch_size_limit_rotates_jobs(tiny_case):
    """Jobs paused for several iterations (not in the batch) resume exactly where they were."""
    out = drive(tiny_case.engine, tiny_case.jobs(ARRIVALS), chunk=50, max_batch=3, seed=5)
    tiny_case.check(out, "max batch 3")
