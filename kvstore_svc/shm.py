"""The pool's POSIX shared-memory segment: created by the store, mapped by clients on its node."""

from __future__ import annotations

import contextlib
import mmap
import os
import re
import secrets
from multiprocessing import shared_memory
from pathlib import Path

# Where Linux keeps POSIX shared memory; a client that cannot open the segment here is on
# another node (or in a container that does not share the store's /dev/shm).
SHM_DIR = Path("/dev/shm")


class SharedSegment:
    """A new segment of ``size`` bytes at a fresh name; ``close()`` unmaps and unlinks it.

    The creating process's resource_tracker records it, so even a store killed with SIGKILL
    leaves no segment behind; ``close()`` (on SIGTERM too) unlinks it right away.
    """

    def __init__(self, size: int):
        if SHM_DIR.is_dir():
            st = os.statvfs(SHM_DIR)
            available = st.f_bavail * st.f_frsize
            # Pages are only claimed on first touch, and a touch beyond what tmpfs can hold is
            # SIGBUS in whichever process writes (a worker, on the same-node path): refuse now.
            if size > available:
                raise OSError(f"{SHM_DIR} has {available} bytes free, the pool needs {size}; "
                              "lower --budget-bytes or enlarge it (docker run --shm-size)")
        self._shm = shared_memory.SharedMemory(
            name=f"fastserve-kv-{os.getpid()}-{secrets.token_hex(4)}", create=True, size=size)

    @property
    def name(self) -> str:
        return self._shm.name

    @property
    def buf(self) -> memoryview:
        buf = self._shm.buf
        assert buf is not None, "segment closed"
        return buf

    def close(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self._shm.unlink()
        # BufferError: a view is still alive; the mapping goes with the process
        with contextlib.suppress(BufferError):
            self._shm.close()


_SEGMENT_NAME = re.compile(r"/?[A-Za-z0-9_][A-Za-z0-9_.-]{0,250}")


def check_segment_name(name: str) -> None:
    """Refuse a segment name that is not one plain file name in /dev/shm: a store that
    answered ``../../some/file`` made the worker map and overwrite that file."""
    if not _SEGMENT_NAME.fullmatch(name):
        raise OSError(f"segment name {name!r} is not a shared-memory name (letters, digits, "
                      "'_', '.', '-'; no path)")


def attach(name: str, size: int) -> mmap.mmap:
    """Map the store's segment ``name`` read-write; OSError when this node cannot open it.

    Opened through /dev/shm rather than ``SharedMemory(name)``: on Python < 3.13 that would
    register the segment with this process's resource_tracker, which unlinks it (and warns
    of a leak) when this client exits, taking the store's pool with it.
    """
    check_segment_name(name)
    if size <= 0:
        raise OSError(f"shared memory size must be > 0, got {size}")
    # O_NOFOLLOW: a link planted in /dev/shm must not lead outside it either.
    fd = os.open(SHM_DIR / name.lstrip("/"), os.O_RDWR | os.O_NOFOLLOW)
    try:
        actual = os.fstat(fd).st_size
        if actual < size:
            raise OSError(f"shared memory {name!r} is {actual} bytes, expected {size}")
        return mmap.mmap(fd, size)
    finally:
        os.close(fd)
