"""A job's id: an ``int`` that compiled code keeps as the object it is.

mypyc holds a value typed ``int`` unboxed, and boxes it again, a new int object for any id
above 256, each time it is used as a dict key or passed as an object: under the simulator's
MLFQ that was 11.8 million allocations for 2,000 requests, 8% of its instructions
(docs/benchmarks.md, "Compiled code that stopped boxing job ids"). An ``int`` subclass defined
in a module mypyc does not compile (this one is not in ``scheduler_svc/compiled.py``'s
``MODULES``) is held as an object. It hashes, compares, prints and serializes as the int it
is; ``Job`` makes one from the id it is given.
"""

from __future__ import annotations


class JobId(int):
    __slots__ = ()
