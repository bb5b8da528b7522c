"""A thread for tokenizer work, so that none of it runs on the scheduler's event loop.

Tokenizing a prompt, rendering a chat or turning a stream's new ids into text can take long
enough (a large prompt once froze every stream for 7.5 s) that the event loop must not do it.
``TextThread.run(fn, *args)`` queues the call for the thread; every call queued in one turn of
the loop goes over in one batch, so streaming 32 requests costs one thread hop per worker iteration,
not one per stream. Each ``TextThread`` owns a ``TextModel`` of its own: a fast tokenizer must
not be entered by two threads at once, and prompts (in) and output text (out) run on two
threads, so that tokenizing one large prompt never delays the others' tokens.
"""

from __future__ import annotations

import asyncio
import copy
import functools
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from scheduler_svc.api.text import TextModel

T = TypeVar("T")

_Call = tuple[Callable[[], Any], asyncio.Future]


class TextThread:
    """One thread and the ``TextModel`` (``text``) that only it uses."""

    def __init__(self, text: TextModel, name: str):
        """``text`` is copied: the caller's model stays free for another thread."""
        self.text = copy.deepcopy(text)
        self._pool = ThreadPoolExecutor(1, thread_name_prefix=name)
        self._queued: list[_Call] = []

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` on the thread (give it ``self.text``, never another thread's model);
        its exception is raised here."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._queued.append((functools.partial(fn, *args), fut))
        if len(self._queued) == 1:
            loop.call_soon(self._send, loop)
        return await fut

    def _send(self, loop: asyncio.AbstractEventLoop) -> None:
        batch, self._queued = self._queued, []
        done = asyncio.wrap_future(self._pool.submit(_run_each, [fn for fn, _ in batch]),
                                   loop=loop)
        done.add_done_callback(functools.partial(_deliver, batch))

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)


def _run_each(fns: list[Callable[[], Any]]) -> list[tuple[bool, Any]]:
    out: list[tuple[bool, Any]] = []
    for fn in fns:
        try:
            out.append((True, fn()))
        except Exception as e:  # noqa: BLE001 - delivered to that call's awaiter alone
            out.append((False, e))
    return out


def _deliver(batch: list[_Call], done: asyncio.Future) -> None:
    if done.cancelled() or done.exception() is not None:  # the pool was shut down
        results: list[tuple[bool, Any]] = [
            (False, RuntimeError("the text thread stopped"))] * len(batch)
    else:
        results = done.result()
    for (_, fut), (ok, value) in zip(batch, results):
        if fut.done():  # its stream went away meanwhile
            continue
        if ok:
            fut.set_result(value)
        else:
            fut.set_exception(value)
