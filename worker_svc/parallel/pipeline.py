"""Steps through the pipeline stages of a worker group.

Stage s holds decoder layers ``stage_layers(L, P, s)`` and their KV only; the first embeds
the tokens, the last computes logits and samples. Every stage keeps the whole engine's
bookkeeping (jobs, token counts, block tables) and applies every Step's frees, swaps,
admissions and commands to its own pool, so each stage's KV for a block id holds its own
layers, and each stage stores its part of an offloaded block in the node's store under its own
lease (one handle per rank, as with tensor ranks).

Rank 0 (``PipelineLeader``) runs a Step's first stage and sends it down the pipe (pipe.py)
without waiting for its tokens: the scheduler keeps up to P Steps in flight, a job in at most
one of them, so while stage 1 computes one batch stage 0 computes the next. The last stage
samples and sends the tokens back to rank 0, whose collector thread settles them and answers
the Step. The stages in between, which never see a token, learn each one from the next Step
rank 0 sends (``StageMessage.settled``): a job's token is always settled before the job is
commanded again, because the scheduler commands it only after the answer.

Each stage checks that its state after a Step matches the stage above's (``fingerprint``), and
rank 0 that the last stage's matches its own: a difference, a failed link, or a failed forward
pass (which a pipeline cannot undo on the stages that already ran it) loses the group
(``GroupLost``), whose jobs then move on as for any lost worker.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass

import torch

from worker_svc.engine import Engine, Prepared, StepCommand, StepOutcome
from worker_svc.parallel.group import EXIT_GROUP_LOST, GroupLost
from worker_svc.parallel.pipe import StageMessage, StageResult

log = logging.getLogger(__name__)


def _forward(engine: Engine, b: Prepared, hidden: torch.Tensor | None) -> torch.Tensor:
    try:
        return engine.model.forward(b.input_ids, b.meta, engine.pool, hidden)
    except GroupLost:
        raise
    except Exception as e:  # the stages above ran it already: the group's state is split
        raise GroupLost(f"forward pass failed on this stage: {type(e).__name__}: {e}") from e


@dataclass
class _InFlight:
    seq: int
    outcome: StepOutcome
    prepared: Prepared | None
    fingerprint: str
    started: float
    future: Future


class PipelineLeader:
    """Rank 0's end: ``submit`` a Step (on the compute thread), get its outcome later."""

    def __init__(self, engine: Engine):
        group = engine.group
        assert group is not None and group.pipe is not None and group.layout.leader
        self.engine = engine
        self.group = group
        self.pipe = group.pipe
        # Guards the jobs' state between the compute thread and the collector.
        self._lock = threading.Lock()
        self._seq = 0
        self._settled: list[dict[int, int]] = []  # tokens the other stages have not heard of
        self._in_flight: queue.Queue[_InFlight | None] = queue.Queue()
        self._lost: GroupLost | None = None
        threading.Thread(target=self._collect, name="pipeline-collect", daemon=True).start()

    def submit(self, cmd: StepCommand | None) -> Future:
        """Run ``cmd``'s first stage and send it on; the future gets its outcome once the
        last stage's tokens are back. ``None`` stops every stage."""
        engine, group = self.engine, self.group
        future: Future = Future()
        if self._lost is not None:
            future.set_exception(self._lost)
            return future
        if cmd is None:
            if group.size > 1:
                group.send_command(None)
            self.pipe.send_down(None, None)
            self._in_flight.put(None)
            future.set_result(StepOutcome())
            return future
        out = StepOutcome()
        with self._lock:
            self._seq += 1
            msg = StageMessage(self._seq, cmd, self._settled)
            self._settled = []
            if group.size > 1:
                group.send_command(msg)  # this stage's other tensor ranks
            batch = engine.begin(cmd, out)
            prepared = engine.prepare(batch) if batch else None
        started = time.perf_counter()
        hidden = None
        if prepared is not None:
            hidden = _forward(engine, prepared, None)
            engine.advance(prepared)
            if prepared.probed and engine.probe is not None:
                msg.predicted.update(engine.observe(prepared, pending=1))
        engine.end(out)
        fingerprint = engine.fingerprint(out)
        if group.size > 1:
            group.agree(fingerprint)
        msg.fingerprint = fingerprint
        self._in_flight.put(_InFlight(msg.seq, out, prepared, fingerprint, started, future))
        self.pipe.send_down(msg, hidden)
        return future

    def _collect(self) -> None:
        """The collector thread: each Step's tokens from the last stage, in order."""
        while (step := self._in_flight.get()) is not None:
            try:
                if self._lost is not None:
                    raise self._lost
                res = self.pipe.receive_back()
                if res.seq != step.seq or res.fingerprint != step.fingerprint:
                    raise GroupLost(f"the last stage answered step {res.seq} with state "
                                    f"{res.fingerprint[:200]!r}; rank 0 sent step {step.seq} "
                                    f"with {step.fingerprint[:200]!r}")
            except GroupLost as e:
                self._lost = e
                step.future.set_exception(e)
                continue
            out = step.outcome
            if step.prepared is not None:
                b = step.prepared
                failed = {i: res.failed[j.job_id] for i, j in enumerate(b.sample_jobs)
                          if j.job_id in res.failed}
                tokens = {j: t for j, (t, _) in res.tokens.items()}
                with self._lock:
                    self.engine.settle(tokens)
                    self._settled.append(tokens)
                    out.results = self.engine.results(b, res.tokens, failed, res.predicted,
                                                      out.errors)
                out.compute_time_s = time.perf_counter() - step.started
            step.future.set_result(out)


def follow_stage(engine: Engine) -> int:
    """A rank other than 0 in a group with pipeline stages: run each Step that reaches this
    rank (from rank 0 on the first stage, from the stage above on the others) until told to
    stop; returns the exit status, as ``follower.follow`` does."""
    group = engine.group
    assert group is not None and group.pipe is not None
    layout, pipe = group.layout, group.pipe
    last = layout.stage == layout.num_stages - 1
    steps = 0
    try:
        while True:
            if layout.stage == 0:
                msg, hidden = group.receive_command(), None
            else:
                msg, hidden = pipe.receive_from_above(engine.model.dtype, engine.device)
            if msg is None:
                if pipe.next is not None:
                    pipe.send_down(None, None)
                log.info("rank %d: rank 0 stopped the group after %d steps",
                         layout.global_rank, steps)
                return 0
            _stage_step(engine, msg, hidden, last, from_above=layout.stage > 0)
            steps += 1
    except GroupLost as e:
        log.error("rank %d: worker group lost after %d steps: %s", layout.global_rank, steps, e)
        return EXIT_GROUP_LOST
    finally:
        engine.swap.close()


def _stage_step(engine: Engine, msg: StageMessage, hidden: torch.Tensor | None, last: bool,
                from_above: bool) -> None:
    group = engine.group
    assert group is not None and group.pipe is not None
    if not last:  # the last stage sampled these itself
        for tokens in msg.settled:
            engine.settle(tokens)
    out = StepOutcome()
    batch = engine.begin(msg.command, out)
    prepared = engine.prepare(batch) if batch else None
    y = None
    tokens: dict[int, tuple[int, float | None]] = {}
    failed: dict[int, str] = {}
    if prepared is not None:
        y = _forward(engine, prepared, hidden)
        engine.advance(prepared)
        if last:
            toks, logprobs, failed_rows = engine._sample(y, prepared.sample_jobs)
            tokens = engine.append_sampled(prepared, toks, logprobs, failed_rows)
            failed = {prepared.sample_jobs[i].job_id: why for i, why in failed_rows.items()}
        if prepared.probed and engine.probe is not None:
            msg.predicted.update(engine.observe(prepared, pending=0 if last else 1))
    engine.end(out)
    fingerprint = engine.fingerprint(out)
    if from_above and fingerprint != msg.fingerprint:
        raise GroupLost(f"stage {group.layout.stage} disagrees with the stage above after "
                        f"step {msg.seq}: {fingerprint[:200]!r} against "
                        f"{msg.fingerprint[:200]!r}")
    if group.size > 1:
        group.agree(fingerprint)
    msg.fingerprint = fingerprint
    if not last:
        group.pipe.send_down(msg, y)
    elif group.rank == 0:
        group.pipe.send_back(StageResult(msg.seq, tokens, failed, msg.predicted, fingerprint))
