"""How ``Ranked`` reads a job's key: ``Key``, and ``RankKey`` with its two kinds."""

from __future__ import annotations

from collections.abc import Callable

from scheduler_svc.core.job import Job

# (primary key, secondary, tertiary): unique per job (the job id is in it), compared as is.
# Typed as a tuple of any length so that mypyc keeps keys as the tuple objects they are:
# a fixed-length tuple type is unboxed into a C struct at every read from a list and boxed
# again, a new tuple, at every comparison, bisection or store.
Key = tuple[float, ...]


class RankKey:
    """A job's key in a ``Ranked``, ``of(job)``: a subclass's method, called as compiled code
    calls one (a Python callable is called through Python's protocol, 250 instructions a
    call: a call per started job per walk)."""

    def of(self, job: Job) -> Key:
        raise NotImplementedError


class KeyCall(RankKey):
    """Any callable as a ``RankKey``."""

    def __init__(self, fn: Callable[[Job], Key]):
        self.fn = fn

    def of(self, job: Job) -> Key:
        return self.fn(job)


class KeptKey(RankKey):
    """The key a policy keeps on the job (``Job.rank_key``): an attribute read, where the key
    moves only when the policy moves it (the MLFQ's place in a queue)."""

    def of(self, job: Job) -> Key:
        return job.rank_key
