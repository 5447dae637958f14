"""One read in flight per source, shared by every caller that asks while it is under way.

Behind a backlog, ComfyUI's `/queue` lists every waiting prompt with its whole graph: megabytes
of JSON. Fifty jobs arriving together each probing it would fetch and parse it fifty times on
the worker's one event loop, and the decisions they wait for would queue behind that work. A
caller that asks while a read is under way takes that read's answer instead: an answer as fresh
as the one its own request would have brought back, since both are in flight at the same time.
A finished answer is never handed out again.
"""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

_T = TypeVar("_T")


class SharedRead(Generic[_T]):
    """`await shared()` runs `read()`, or joins the run in flight. The run belongs to no caller:
    one that gives up (its own timeout) does not cancel it for the others, so `read` must bound
    itself."""

    def __init__(self, read: Callable[[], Awaitable[_T]]) -> None:
        self._read = read
        self._running: asyncio.Task[_T] | None = None

    async def __call__(self) -> _T:
        if self._running is None:
            # An empty context: no caller's activity context (heartbeats, logger) leaks in.
            self._running = asyncio.create_task(self._run(), context=contextvars.Context())
            self._running.add_done_callback(self._done)
        return await asyncio.shield(self._running)

    async def _run(self) -> _T:
        return await self._read()

    def _done(self, task: asyncio.Task[_T]) -> None:
        if self._running is task:
            self._running = None
        if not task.cancelled():
            task.exception()  # retrieved here: callers that all gave up leave no warning behind
