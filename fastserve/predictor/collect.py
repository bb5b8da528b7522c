"""Run prompts through an engine and record what the predictor learns from.

Each prompt is rendered as one user chat message (as the scheduler renders a chat request),
sampled with its own seed, and run to its end-of-sequence token or the cap, up to
``batch_size`` at a time, on ``worker_svc.engine.Engine`` directly (no services). The
``Recorder`` probe keeps, at every step where ``predictor.wanted`` says a serving predictor
would predict, the hidden state of each candidate layer; once a job ends, each of its samples
gets its label, the output tokens still to come.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import torch

from worker_svc.engine import Engine, JobCommand, NewJob, StepCommand
from worker_svc.predictor import features, wanted
from worker_svc.sampler import SamplingParams

if TYPE_CHECKING:
    from worker_svc.loader import LoadedModel


@dataclass
class Samples:
    """Training rows: features per candidate layer, the prompt each came from, the tokens
    generated when it was taken and the tokens still to come."""

    layers: tuple[int, ...]
    feats: dict[int, list[torch.Tensor]] = field(default_factory=dict)
    prompt_index: list[int] = field(default_factory=list)
    generated: list[int] = field(default_factory=list)
    remaining: list[int] = field(default_factory=list)

    def tensors(self) -> tuple[dict[int, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
        return ({layer: torch.stack(rows) for layer, rows in self.feats.items()},
                torch.tensor(self.prompt_index), torch.tensor(self.generated),
                torch.tensor(self.remaining, dtype=torch.float32))


class Recorder:
    """An engine probe that records features instead of predicting (see ``Probe``)."""

    def __init__(self, layers: Sequence[int], refresh: int):
        self.layers = tuple(layers)
        self.refresh = refresh
        # Per live job id: (generated, {layer: features}) rows waiting for the job's end.
        self.pending: dict[int, list[tuple[int, dict[int, torch.Tensor]]]] = {}

    def wants(self, num_generated: int) -> bool:
        return wanted(num_generated, self.refresh)

    def observe(self, hidden: dict[int, torch.Tensor], job_ids: Sequence[int],
                prompt_lens: Sequence[int], generated: Sequence[int],
                outputs: Sequence[Sequence[int]] | None = None) -> list[None]:
        rows = {layer: features(h, prompt_lens, generated).cpu() for layer, h in hidden.items()}
        for r, (jid, g) in enumerate(zip(job_ids, generated)):
            self.pending.setdefault(jid, []).append((g, {k: v[r] for k, v in rows.items()}))
        return [None] * len(generated)


def chat_engine(model: str, instructions: Sequence[str], *, max_tokens: int, batch_size: int,
                device: str = "cpu") -> tuple[LoadedModel, list[list[int]], set[int]]:
    """The model loaded (``worker_svc.loader.load_engine``, no predictor) with
    blocks for ``batch_size`` answers of up to ``max_tokens`` at once, ``instructions``
    rendered as one user chat message each (as the scheduler renders a chat request), and the
    token ids that end an answer."""
    from fastserve.models import resolve_model
    from scheduler_svc.api.text import TextModel
    from worker_svc.loader import EngineConfig, load_engine

    text = TextModel.load(str(resolve_model(model)))
    prompts = [text.render_chat([("user", t)]) for t in instructions]
    longest = max(len(p) for p in prompts) + max_tokens
    blocks = batch_size * (-(-longest // 16) + 1)
    loaded = load_engine(EngineConfig(model, device=device, num_blocks=blocks,
                                      predictor="none", max_context=longest + 16))
    return loaded, prompts, set(loaded.spec.eos_token_ids) | text.eos_token_ids


def answer_sampling(n: int, samples: int, temperature: float, top_p: float, seed: int
                    ) -> list[SamplingParams]:
    """Sampling for ``samples`` answers to each of ``n`` prompts, answer k of prompt i seeded
    ``(seed + k) * 1_000_003 + i`` (the first answers are the ones one sample gives), in the
    order ``collect_answers`` generates them: every prompt's first answer, then the second..."""
    return [SamplingParams(temperature, top_p, 0, (seed + k) * 1_000_003 + i)
            for k in range(samples) for i in range(n)]


def collect_answers(engine: Engine, prompts: Sequence[Sequence[int]], *,
                    sampling: Sequence[SamplingParams], **kwargs: Any
                    ) -> tuple[Samples, list[list[int]]]:
    """Answers to every prompt, one per entry of ``sampling`` (a whole number of answers per
    prompt, ordered as ``answer_sampling`` orders them), through ``collect`` (``kwargs``: its
    other arguments). The same prompt's answers differ in length; several teach the probe the
    expected length rather than one draw. Rows are labelled with their prompt's index (so a
    split by prompt keeps a prompt's answers together); lengths come back per answer, then
    per prompt."""
    n = len(prompts)
    samples = len(sampling) // n if n else 0
    if samples < 1 or len(sampling) != samples * n:
        raise ValueError(f"need one sampling per answer, a whole number of answers for each "
                         f"of the {n} prompts; got {len(sampling)}")
    out, lengths = collect(engine, [p for _ in range(samples) for p in prompts],
                           sampling=sampling, **kwargs)
    out.prompt_index = [i % n for i in out.prompt_index]
    return out, [lengths[k * n:(k + 1) * n] for k in range(samples)]


def collect(engine: Engine, prompts: Sequence[Sequence[int]], *, eos: set[int],
            max_tokens: int, sampling: Sequence[SamplingParams], batch_size: int,
            layers: Sequence[int], refresh: int, progress: bool = True
            ) -> tuple[Samples, list[int]]:
    """Generate every prompt; return the recorded samples and each prompt's output length."""
    from tqdm import tqdm

    recorder = Recorder(layers, refresh)
    engine.probe = recorder
    bs = engine.pool.block_size
    free = list(range(engine.pool.config.num_blocks))
    out = Samples(tuple(layers), {layer: [] for layer in layers})
    lengths = [0] * len(prompts)
    queue = list(range(len(prompts)))[::-1]
    running: dict[int, int] = {}  # job id (= prompt index) -> tokens generated
    blocks: dict[int, list[int]] = {}
    bar = tqdm(total=len(prompts), desc="generating", unit="prompt", disable=not progress,
               file=sys.stderr)
    while queue or running:
        cmd = StepCommand()
        for jid in running:
            cmd.commands.append(JobCommand(jid, 1))
        while queue and len(running) < batch_size:
            jid = queue.pop()
            need = math.ceil((len(prompts[jid]) + max_tokens) / bs)
            if need > len(free):
                raise ValueError(f"prompt {jid} needs {need} KV blocks; the pool has "
                                 f"{len(free)} free (raise num_blocks)")
            blocks[jid], free = free[:need], free[need:]
            cmd.new_jobs.append(NewJob(jid, list(prompts[jid]), sampling[jid], blocks[jid]))
            cmd.commands.append(JobCommand(jid, len(prompts[jid])))
            running[jid] = 0
        result = engine.step(cmd)
        if result.errors:
            raise RuntimeError(f"engine error: {result.errors[0]}")
        done = []
        for r in result.results:
            running[r.job_id] += 1
            if r.token_id in eos or running[r.job_id] >= max_tokens:
                done.append(r.job_id)
        for jid in done:
            total = running.pop(jid)
            lengths[jid] = total
            for g, rows in recorder.pending.pop(jid, []):
                for layer, row in rows.items():
                    out.feats[layer].append(row)
                out.prompt_index.append(jid)
                out.generated.append(g)
                out.remaining.append(total - g)
            engine.step(StepCommand(free_job_ids=[jid]))
            free.extend(blocks.pop(jid))
            bar.update(1)
    bar.close()
    engine.probe = None
    return out, lengths
