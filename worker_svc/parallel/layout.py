"""Where a process sits in its worker group, and how a group ends: shared by the tensor
group (group.py), the pipeline's links (pipe.py) and everything that runs a Step on them."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import NoReturn

# Rank 0 sends every rank an empty Step when it has sent none for this long (server.py), so
# commands never stop for long, even in an idle group...
HEARTBEAT_S = 2.0
# ...and a follower that hears nothing for this many heartbeats (or the group timeout, if
# longer) takes rank 0 for lost: cut off, it would otherwise wait for ever.
COMMAND_WAIT_HEARTBEATS = 12
# Exit status of a rank whose group was lost (the supervisor restarts the group).
EXIT_GROUP_LOST = 75


class GroupLost(RuntimeError):
    """A rank of this group died, hung, was cut off, or disagrees: the group's state is gone."""


def exit_group_lost() -> NoReturn:
    """End this rank at once with ``EXIT_GROUP_LOST``, its log flushed: its state is worthless,
    and tearing down process groups whose links are broken can abort the process (gloo)
    instead of letting it exit with the status the supervisor reads."""
    logging.shutdown()
    os._exit(EXIT_GROUP_LOST)


@dataclass(frozen=True)
class GroupLayout:
    """Where this process sits in its worker group: tensor rank ``rank`` of ``size`` inside
    pipeline stage ``stage`` of ``num_stages`` (a group of ``size x num_stages`` processes)."""

    rank: int = 0  # tensor-parallel rank inside its stage
    size: int = 1  # tensor-parallel ranks per stage
    address: str = ""  # HOST:PORT of the rendezvous (rank 0 binds it); "" for one process
    timeout_s: float = 30.0  # bound on one collective inside a Step
    stage: int = 0  # pipeline stage
    num_stages: int = 1  # pipeline stages

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ValueError(f"tensor_parallel_size must be >= 1, got {self.size}")
        if not 0 <= self.rank < self.size:
            raise ValueError(f"tensor_parallel_rank must be in [0, {self.size}), got {self.rank}")
        if self.num_stages < 1:
            raise ValueError(f"pipeline_parallel_size must be >= 1, got {self.num_stages}")
        if not 0 <= self.stage < self.num_stages:
            raise ValueError(f"pipeline_parallel_rank must be in [0, {self.num_stages}), got "
                             f"{self.stage}")
        if self.parallel:
            host, _, port = self.address.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"group address must be HOST:PORT, got {self.address!r}")
        if not self.timeout_s > 0:
            raise ValueError(f"group timeout must be positive, got {self.timeout_s}")

    @property
    def world_size(self) -> int:
        return self.size * self.num_stages

    @property
    def global_rank(self) -> int:
        """Ranks count tensor ranks first: stage s holds ``[s * size, (s + 1) * size)``."""
        return self.stage * self.size + self.rank

    @property
    def parallel(self) -> bool:
        return self.world_size > 1

    @property
    def pipelined(self) -> bool:
        return self.num_stages > 1

    @property
    def leader(self) -> bool:
        """The group's rank 0: the only one the scheduler talks to."""
        return self.global_rank == 0

    @property
    def samples(self) -> bool:
        """Whether this rank computes logits and samples: rank 0 of the last stage."""
        return self.rank == 0 and self.stage == self.num_stages - 1

    def describe(self) -> str:
        parts = []
        if self.size > 1:
            parts.append(f"tensor-parallel rank {self.rank} of {self.size}")
        if self.num_stages > 1:
            parts.append(f"pipeline stage {self.stage} of {self.num_stages}")
        return ", ".join(parts)
