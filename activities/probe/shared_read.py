"""One read in flight per source, shared by every caller that asks while it is under way, and
optionally a good answer shared for a moment after.

Behind a backlog, ComfyUI's `/queue` lists every waiting prompt with its whole graph: with 1,000
prompts, parsing it was a third of the worker's event loop while 50 new jobs decided
(bench/backlog.py, py-spy). A caller that asks while a read is under way takes that read's
answer: as fresh as the one its own request would have brought back, since both are in flight at
once. With `reuse_s`, an answer `reusable` accepts is also handed to callers that ask within
`reuse_s` of its request; any other answer (a failure) is never handed out again once finished.
"""

from __future__ import annotations

import asyncio
import contextvars
import time
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

_T = TypeVar("_T")


class SharedRead(Generic[_T]):
    """`await shared()` runs `read()`, joins the run in flight, or takes a reusable answer. The
    run belongs to no caller: one that gives up (its own timeout) does not cancel it for the
    others, so `read` must bound itself."""

    def __init__(
        self,
        read: Callable[[], Awaitable[_T]],
        *,
        reuse_s: float = 0.0,
        reusable: Callable[[_T], bool] = lambda _: True,
    ) -> None:
        self._read, self._reuse_s, self._reusable = read, reuse_s, reusable
        self._running: asyncio.Task[_T] | None = None
        self._kept: tuple[float, _T] | None = None  # (when its request started, the answer)

    async def __call__(self) -> _T:
        if self._kept is not None and time.monotonic() - self._kept[0] <= self._reuse_s:
            return self._kept[1]
        if self._running is None:
            # An empty context: no caller's activity context (heartbeats, logger) leaks in.
            self._running = asyncio.create_task(self._run(), context=contextvars.Context())
            self._running.add_done_callback(self._done)
        return await asyncio.shield(self._running)

    async def _run(self) -> _T:
        started = time.monotonic()
        answer = await self._read()
        if self._reuse_s > 0 and self._reusable(answer):
            self._kept = (started, answer)
        return answer

    def _done(self, task: asyncio.Task[_T]) -> None:
        if self._running is task:
            self._running = None
        if not task.cancelled():
            task.exception()  # retrieved here: callers that all gave up leave no warning behind
