"""The links between the pipeline stages of one worker group (torch.distributed point to point).

Tensor rank t of stage s sends each Step on to tensor rank t of stage s + 1: a header (the
command, what rank 0 has learnt since, this stage's state fingerprint) and the residual stream
the next stage's layers start from. Each tensor rank of a stage holds the whole residual stream
(the tensor all-reduces give every rank the same sum), so no stage needs to gather or scatter.
Rank 0 of the last stage sends the sampled tokens back to the group's rank 0 on a link of its
own, so rank 0 can send the next Step down the pipe while it waits for the last one's tokens.

Every link is a pair of two-rank process groups: a gloo one for headers (pickled), whose
timeout outlasts the gaps between rank 0's heartbeats as the command group's does (group.py:
a stage waits there for the next Step), and one for the activations (NCCL on CUDA, gloo on
the CPU) with the group's timeout, as the all-reduces have, since they follow their header at
once. Rank 0 waits for a Step's tokens on the way back with the group's timeout too, so a
stage that died, hung or was cut off mid-Step loses the group within it; any failed send or
receive is ``GroupLost``.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from worker_svc.parallel.layout import GroupLayout, GroupLost


@dataclass
class StageMessage:
    """One Step on its way down the pipe (None stops the stages)."""

    seq: int  # rank 0's count of Steps sent down the pipe
    command: Any  # the StepCommand
    # Tokens rank 0 got back since its last message, job id -> token (stages that do not
    # sample append them before this command, so every stage's token counts agree).
    settled: list[dict[int, int]] = field(default_factory=list)
    fingerprint: str = ""  # the sending stage's state after this Step: the next must agree
    hidden_shape: tuple[int, ...] | None = None  # the residual stream that follows, if any
    # Output-length predictions of the rows sampled, by job id, from the stage that holds
    # the predictor's layer.
    predicted: dict[int, float] = field(default_factory=dict)


@dataclass
class StageResult:
    """The last stage's answer to one Step, sent to rank 0."""

    seq: int
    tokens: dict[int, tuple[int, float]]  # job id -> (token, logprob)
    failed: dict[int, str]  # job id -> why its row could not be sampled
    predicted: dict[int, float]
    fingerprint: str


class Pipe:
    """This rank's links to its neighbours in the pipeline."""

    def __init__(self, layout: GroupLayout, backend: str, timeout: datetime.timedelta,
                 step_timeout: datetime.timedelta):
        """``timeout``: how long a stage waits for the next Step; ``step_timeout``: for the
        parts of a Step in flight (activations, tokens back)."""
        self.layout = layout
        size, stages = layout.size, layout.num_stages
        me = layout.global_rank
        self.prev: int | None = None
        self.next: int | None = None
        self._prev_groups: tuple[Any, Any] | None = None
        self._next_groups: tuple[Any, Any] | None = None
        # Every rank makes every link, in the same order (torch.distributed's rule).
        for stage in range(stages - 1):
            for t in range(size):
                a, b = stage * size + t, (stage + 1) * size + t
                headers = dist.new_group([a, b], backend="gloo", timeout=timeout)
                tensors = dist.new_group([a, b], backend=backend, timeout=step_timeout)
                if me == a:
                    self.next, self._next_groups = b, (headers, tensors)
                if me == b:
                    self.prev, self._prev_groups = a, (headers, tensors)
        self.sampler = (stages - 1) * size  # rank 0 of the last stage
        back = dist.new_group([0, self.sampler], backend="gloo", timeout=step_timeout)
        self._back = back if me in (0, self.sampler) else None

    def send_down(self, msg: StageMessage | None, hidden: torch.Tensor | None) -> None:
        assert self.next is not None and self._next_groups is not None
        headers, tensors = self._next_groups
        if msg is not None:
            msg.hidden_shape = tuple(hidden.shape) if hidden is not None else None
        try:
            dist.send_object_list([msg], dst=self.next, group=headers)
            if msg is not None and hidden is not None:
                dist.send(hidden.contiguous(), dst=self.next, group=tensors)
        except Exception as e:
            raise GroupLost(f"sending to stage rank {self.next} failed: {e}") from e

    def receive_from_above(self, dtype: torch.dtype, device: torch.device
                           ) -> tuple[StageMessage | None, torch.Tensor | None]:
        assert self.prev is not None and self._prev_groups is not None
        headers, tensors = self._prev_groups
        box: list[Any] = [None]
        try:
            dist.recv_object_list(box, src=self.prev, group=headers)
            msg = box[0]
            hidden = None
            if msg is not None and msg.hidden_shape is not None:
                hidden = torch.empty(msg.hidden_shape, dtype=dtype, device=device)
                dist.recv(hidden, src=self.prev, group=tensors)
        except Exception as e:
            raise GroupLost(f"receiving from stage rank {self.prev} failed: {e}") from e
        return msg, hidden

    def send_back(self, result: StageResult) -> None:
        try:
            dist.send_object_list([result], dst=0, group=self._back)
        except Exception as e:
            raise GroupLost(f"sending tokens to rank 0 failed: {e}") from e

    def receive_back(self) -> StageResult:
        box: list[Any] = [None]
        try:
            dist.recv_object_list(box, src=self.sampler, group=self._back)
        except Exception as e:
            raise GroupLost(f"receiving tokens from the last stage failed: {e}") from e
        return box[0]
