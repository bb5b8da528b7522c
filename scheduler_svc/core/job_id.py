"""A job's id: an ``int`` that compiled code keeps as the object it is.

mypyc holds a value typed ``int`` unboxed, and boxes it, a new int object for any id above
256, each time it is used as a dict key or passed as an object.
"""

from __future__ import annotations


class JobId(int):
    __slots__ = ()
