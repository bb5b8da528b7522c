"""A follower rank's loop: rank 0's Steps, applied to this rank's shard, until told to stop."""

from __future__ import annotations

import logging

from worker_svc.engine import Engine
from worker_svc.parallel.group import EXIT_GROUP_LOST, GroupLost

log = logging.getLogger(__name__)


def follow(engine: Engine) -> int:
    """Run every command rank 0 sends; return the process's exit status: 0 when rank 0 said
    stop, EXIT_GROUP_LOST when the group fell apart (rank 0 died, a collective failed, or the
    ranks disagree)."""
    group = engine.group
    assert group is not None and group.rank > 0, "only a group's follower ranks follow"
    steps = 0
    try:
        while True:
            cmd = group.receive_command()
            if cmd is None:
                log.info("rank %d: rank 0 stopped the group after %d steps", group.rank, steps)
                return 0
            engine.step(cmd)
            steps += 1
    except GroupLost as e:
        log.error("rank %d: worker group lost after %d steps: %s", group.rank, steps, e)
        return EXIT_GROUP_LOST
    finally:
        engine.swap.close()
