"""The link between the ranks of one worker group (torch.distributed): the tensor ranks of a
stage, and the process groups every rank makes (pipeline stages add their links, pipe.py).

Rank 0 is the only rank the scheduler talks to. Every Step it receives goes to the other ranks
first (``send_command``), so that all ranks apply the same frees, swaps, admissions and
commands to their own shard and run the same forward pass; inside it the model all-reduces
twice per layer (``all_reduce``). Rank 0 samples and hands the tokens to the others
(``share_tokens``), so sampling randomness never has to agree; at the end of a Step the ranks
compare a fingerprint of their state (``agree``), and any difference, like any failed
collective, is ``GroupLost``: the group's state can no longer be trusted, and its processes exit
so that the supervisor restarts the whole group and the scheduler moves its jobs.

Two process groups over one rendezvous (a TCPStore at rank 0's address): commands travel on one
whose timeout outlasts the gaps between rank 0's heartbeats (an idle group still gets an empty
Step every few seconds), so a follower cut off from rank 0 gives up too, while rank 0 waits
for each send only the group's bounded timeout; everything inside a Step on one with that
bounded timeout, so a rank that hangs is noticed. gloo on CPU,
NCCL on CUDA; on CPU, ranks that share a host sum through shared memory instead
(shm_reduce.py). Like every
torch.distributed rendezvous, the address must be on a network only the group's hosts reach
(``fastserve serve`` binds it to 127.0.0.1; another address needs ``--insecure``).
"""

from __future__ import annotations

import datetime
import hashlib
import logging
import os
import pickle
from typing import Any

import torch
import torch.distributed as dist

from worker_svc.parallel import shm_reduce
from worker_svc.parallel.layout import (  # re-exported: the group's names
    COMMAND_WAIT_HEARTBEATS,
    EXIT_GROUP_LOST,
    HEARTBEAT_S,
    GroupLayout,
    GroupLost,
)
from worker_svc.parallel.pipe import Pipe
from worker_svc.parallel.shm_reduce import ShmAllReduce

__all__ = ["COMMAND_WAIT_HEARTBEATS", "EXIT_GROUP_LOST", "HEARTBEAT_S", "GroupLayout",
           "GroupLost", "TensorGroup"]

log = logging.getLogger(__name__)


def _gloo_interface(host: str, port: int) -> str | None:
    """The network interface this host reaches the rendezvous through, for gloo: by default
    gloo binds to whatever the hostname resolves to (often 127.0.0.1), which other hosts
    cannot reach."""
    import fcntl
    import socket
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((host, port))  # sends nothing: picks the route and its source address
        local = probe.getsockname()[0]
        for _, name in socket.if_nameindex():
            try:  # SIOCGIFADDR: the interface's IPv4 address
                raw = fcntl.ioctl(probe.fileno(), 0x8915, struct.pack("256s", name[:15].encode()))
            except OSError:
                continue
            if socket.inet_ntoa(raw[20:24]) == local:
                return name
    return None


class TensorGroup:
    """This rank's end of the group; built once the rank's model is loaded. Collectives run
    among the tensor ranks of this rank's stage (all of the group without pipeline stages);
    ``pipe`` links the stages (pipe.py)."""

    def __init__(self, layout: GroupLayout, device: torch.device,
                 rendezvous_timeout_s: float = 900.0):
        self.layout = layout
        self.rank = layout.rank
        self.size = layout.size
        self.device = device
        host, _, port = layout.address.rpartition(":")
        backend = "nccl" if device.type == "cuda" else "gloo"
        me, world = layout.global_rank, layout.world_size
        store = dist.TCPStore(host, int(port), world, is_master=me == 0,
                              timeout=datetime.timedelta(seconds=rendezvous_timeout_s))
        log.info("rank %d of %d (%s): joining the group at %s (%s)", me, world,
                 layout.describe(), layout.address, backend)
        if "GLOO_SOCKET_IFNAME" not in os.environ:  # an operator's choice wins
            interface = _gloo_interface(host, int(port))
            if interface is not None:
                os.environ["GLOO_SOCKET_IFNAME"] = interface
        dist.init_process_group(backend, store=store, rank=me, world_size=world,
                                timeout=datetime.timedelta(seconds=layout.timeout_s))
        # Commands always go over gloo (pickled objects), with a wait that outlasts the gaps
        # between rank 0's heartbeats.
        wait_s = max(layout.timeout_s, COMMAND_WAIT_HEARTBEATS * HEARTBEAT_S)
        wait = datetime.timedelta(seconds=wait_s)
        # Every rank makes every subgroup, in the same order (torch.distributed's rule); it
        # keeps its own stage's.
        self.ranks = list(range(layout.stage * layout.size, (layout.stage + 1) * layout.size))
        self._src = self.ranks[0]
        self._tensor: Any = None
        self._commands: Any = None
        for stage in range(layout.num_stages):
            ranks = list(range(stage * layout.size, (stage + 1) * layout.size))
            tensor = dist.new_group(ranks) if layout.pipelined else dist.group.WORLD
            commands = dist.new_group(ranks, backend="gloo", timeout=wait)
            if stage == layout.stage:
                self._tensor, self._commands = tensor, commands
        self.pipe = (Pipe(layout, backend, wait,
                          datetime.timedelta(seconds=layout.timeout_s))
                     if layout.pipelined else None)
        self._store = store  # rank 0 serves the rendezvous for as long as it holds it
        self._shm = (self._shared_memory() if device.type == "cpu" and self.size > 1
                     else None)
        log.info("rank %d of %d: group ready%s", me, world,
                 "" if self.size == 1 else ", all-reduce over " +
                 ("shared memory" if self._shm is not None else backend))

    def _shared_memory(self) -> ShmAllReduce | None:
        """A shared-memory all-reduce when every rank is on this host (shm_reduce.py)."""
        if not shm_reduce.usable():
            return None
        hosts: list[str | None] = [None] * self.size
        dist.all_gather_object(hosts, shm_reduce.host_identity(), group=self._tensor)
        if len(set(hosts)) != 1:
            return None
        shm, name = None, None
        if self.rank == 0:
            try:
                shm = ShmAllReduce(0, self.size, self.layout.timeout_s)
                name = shm.name
            except OSError as e:
                log.warning("rank 0: no shared-memory all-reduce (%s); gloo instead", e)
        name = self._broadcast_object(name)  # None: rank 0 could not make one
        if self.rank != 0 and name is not None:
            try:
                shm = ShmAllReduce(self.rank, self.size, self.layout.timeout_s, name)
            except OSError as e:
                log.warning("rank %d: no shared-memory all-reduce (%s); gloo instead",
                            self.rank, e)
        ok = torch.tensor([1 if shm is not None else 0])
        # every rank attached, or none uses it
        dist.all_reduce(ok, op=dist.ReduceOp.MIN, group=self._tensor)
        ranks: list[tuple[int, int] | None] = [None] * self.size
        dist.all_gather_object(ranks, (shm_reduce.pid_namespace(), os.getpid()),
                               group=self._tensor)
        if shm is not None:
            shm.unlink()  # all have mapped it: nothing is left behind if a rank dies
            if len({r[0] for r in ranks if r is not None}) == 1:  # their pids mean the same
                shm.watch([r[1] for r in ranks if r is not None])
        return shm if int(ok) == 1 else None

    # ---- inside the forward pass

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the ranks, in place; returns it (the same bits on every rank)."""
        try:
            if self._shm is not None and self._shm.fits(t):
                return self._shm.all_reduce(t)
            dist.all_reduce(t, group=self._tensor)
        except Exception as e:
            raise GroupLost(f"all-reduce failed: {e}") from e
        return t

    # ---- per Step

    def send_command(self, cmd: Any) -> None:
        """Rank 0: the next Step (or None to stop the followers) to every other rank."""
        self._broadcast_object(cmd)

    def receive_command(self) -> Any:
        """A follower: wait for rank 0's next command."""
        return self._broadcast_object(None)

    def share_tokens(self, tokens: list[int]) -> list[int]:
        """Rank 0's sampled tokens (-1: a row that could not be sampled), on every rank."""
        t = torch.tensor(tokens if self.rank == 0 else [0] * len(tokens), dtype=torch.long)
        try:
            if self._shm is not None and self._shm.fits(t):
                return self._shm.all_reduce(t).tolist()  # the others add zeros
            dist.broadcast(t, src=self._src, group=self._tensor)  # bounded: inside a Step
        except Exception as e:
            raise GroupLost(f"token broadcast failed: {e}") from e
        return t.tolist()

    def agree(self, state: str) -> None:
        """Raise GroupLost unless every rank passes the same ``state`` (a Step's outcome)."""
        digest = int.from_bytes(hashlib.sha256(state.encode()).digest()[:7], "little")
        t = torch.zeros(self.size, dtype=torch.long)
        t[self.rank] = digest
        try:
            if self._shm is not None:
                self._shm.all_reduce(t)  # every rank's digest in its own place
            else:
                dist.all_reduce(t, group=self._tensor)
        except Exception as e:
            raise GroupLost(f"state check failed: {e}") from e
        if len(set(t.tolist())) != 1:
            raise GroupLost(f"rank {self.rank}: the group's ranks disagree after a step "
                            f"(this rank: {state[:200]})")

    def _broadcast_object(self, obj: Any) -> Any:
        """``obj`` from rank 0, on every rank: its length, then its pickled bytes. A follower
        waits as long as the command group's timeout (heartbeats come every few seconds);
        rank 0 waits only the group's bounded timeout, since its followers wait for it: a gloo
        send finishes only once the other end has posted its receive, so a cut-off follower
        would otherwise hold rank 0 for the whole command wait."""
        try:
            if self.rank == 0:
                data = torch.frombuffer(bytearray(pickle.dumps(obj)), dtype=torch.uint8)
                bound = datetime.timedelta(seconds=self.layout.timeout_s)
                for t in (torch.tensor([data.numel()], dtype=torch.long), data):
                    dist.broadcast(t, src=self._src, group=self._commands,
                                   async_op=True).wait(bound)
                return obj
            length = torch.zeros(1, dtype=torch.long)
            dist.broadcast(length, src=self._src, group=self._commands)
            data = torch.empty(int(length), dtype=torch.uint8)
            dist.broadcast(data, src=self._src, group=self._commands)
        except Exception as e:
            raise GroupLost(f"command broadcast failed: {e}") from e
        return pickle.loads(data.numpy().tobytes())

