"""One heartbeat for every long activity (ComfyUI wait, download and cancel; MiniMax create, poll
and download).

Temporal notices a dead worker only through missing heartbeats, and the workflow's heartbeat
timeout is short (SPILLWAY_HEARTBEAT_TIMEOUT_S, at most 30 s). A request or a backoff can take
longer than that, so the beat runs in the background, independent of what the activity awaits:
a slow server never looks like a dead worker, and a dead worker is noticed within the timeout.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import Self

from temporalio import activity

from spillway.models import Progress


class Heartbeat:
    """`async with Heartbeat(every_s, details) as hb:` heartbeats the latest details on entry and
    every `every_s` seconds until the block ends. `details=None` heartbeats without details
    (nothing is known yet, e.g. ComfyUI has not answered)."""

    def __init__(self, every_s: float, details: Progress | None = None) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s must be positive, not {every_s}")
        self._every, self._details = every_s, details
        self._task: asyncio.Task[None] | None = None

    @property
    def details(self) -> Progress | None:
        return self._details

    def update(self, details: Progress, *, now: bool = False) -> None:
        """Beat `details` from now on; `now=True` also beats them at once, for a change a person
        follows in the UI (a new phase, a node's progress) that should not wait for the next
        beat. Temporal's SDK throttles what it sends to the server, so frequent beats are cheap."""
        self._details = details
        if now:
            self.beat()

    def beat(self) -> None:
        """Heartbeat the latest details right now."""
        if self._details is None:
            activity.heartbeat()
        else:
            activity.heartbeat(self._details)

    async def _beat_forever(self) -> None:
        while True:
            await asyncio.sleep(self._every)
            self.beat()

    async def __aenter__(self) -> Self:
        self.beat()
        self._task = asyncio.create_task(self._beat_forever())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            # Waits without raising: the block's own exception (or result) is what counts.
            await asyncio.wait({self._task})
            self._task = None
