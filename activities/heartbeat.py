"""How a long activity stays alive for Temporal: one heartbeat for every long activity (ComfyUI
wait, download and cancel; the clouds' create, poll and download), and the handover of waits and
downloads when their worker shuts down.

Temporal notices a dead worker only through missing heartbeats, and the workflow's heartbeat
timeout is short (SPILLWAY_HEARTBEAT_TIMEOUT_S, at most 30 s). A request or a backoff can take
longer than that, so the beat runs in the background, independent of what the activity awaits:
a slow server never looks like a dead worker, and a dead worker is noticed within the timeout.

A block that starts without details beats nothing on entry: the timeout counts from the
activity's start, so the first regular beat (after `every_s`, shorter than the timeout) is soon
enough, and an activity that ends sooner sends none (a job's ComfyUI wait and download each sent
one for nothing). That also keeps the first beat free for what must reach the server at once:
Temporal's SDK sends an attempt's first heartbeat immediately and holds later ones back for up
to 0.8 of the timeout, so a submit's "posting" beat (its next attempt's warning of a POST in
flight) must be that first one.

A worker's shutdown grace (SPILLWAY_SHUTDOWN_GRACE_S) must outlast the longest cloud create,
which is never abandoned once sent. Waits and downloads would hold a deploy for that whole
grace; instead they stop at once with a retryable error (`unless_shutting_down`), and another
worker picks them up: a wait looks at ComfyUI's history first, a download keeps finished files.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from types import TracebackType
from typing import Any, Self, TypeVar

from temporalio import activity
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from spillway.core import names
from spillway.core.models import Progress, RenderProgress

SHUTTING_DOWN = "WorkerShuttingDown"
# How soon a render's progress reaches the server: the waits' heartbeat throttle (status, watch)
# and the relay's interval (the UI's current details).
PROGRESS_EVERY_S = 1.5
_T = TypeVar("_T")


class _Beside:
    """A task that runs beside an `async with` block and is cancelled when the block ends."""

    _task: asyncio.Task[None] | None = None

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


class Heartbeat(_Beside):
    """`async with Heartbeat(every_s, details) as hb:` heartbeats the latest details on entry and
    every `every_s` seconds until the block ends. `details=None` beats nothing on entry and then
    beats without details until some are known (e.g. ComfyUI has not answered yet)."""

    def __init__(self, every_s: float, details: Progress | None = None) -> None:
        if every_s <= 0:
            raise ValueError(f"every_s must be positive, not {every_s}")
        self._every, self._details = every_s, details

    @property
    def details(self) -> Progress | None:
        return self._details

    def update(self, details: Progress, *, now: bool = False) -> None:
        """Beat `details` from now on; `now=True` also beats them at once, for what the server
        must have before the activity goes on (see the module's docstring). Temporal's SDK
        throttles what it sends to the server, so frequent beats are cheap."""
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
        if self._details is not None:
            self.beat()
        self._task = asyncio.create_task(self._beat_forever())
        return self


class ProgressRelay(_Beside):
    """`async with ProgressRelay(client) as relay:` signals the latest progress that `relay.send`
    was given to the activity's job (the UI's current details), at most every PROGRESS_EVERY_S
    for its first FAST_SIGNALS, then every SLOW_EVERY_S: each signal is about four history
    events, and a render that moves for hours must stay far below the server's history limits
    (warned at 10,240 events: 6 hours of steady progress send about 1,100 signals). A signal that
    fails is dropped (the job has ended, the server is busy): progress is shown, it decides
    nothing."""

    FAST_SIGNALS = 400  # ten minutes of progress at PROGRESS_EVERY_S
    SLOW_EVERY_S = 30.0

    def __init__(self, client: Client | None, every_s: float = PROGRESS_EVERY_S) -> None:
        self._client, self._every = client, every_s
        self._signals = 0
        self._latest: RenderProgress | None = None
        self._sent: RenderProgress | None = None
        self._news = asyncio.Event()

    def send(self, progress: RenderProgress) -> None:
        self._latest = progress
        self._news.set()

    async def _relay(self, client: Client) -> None:
        info = activity.info()
        handle = client.get_workflow_handle(info.workflow_id or "", run_id=info.workflow_run_id)
        while True:
            await self._news.wait()
            self._news.clear()
            latest = self._latest
            if latest is None or latest == self._sent:
                continue
            try:
                await handle.signal(names.RENDER_PROGRESS_SIGNAL, latest)
                self._sent = latest
            except Exception as exc:
                activity.logger.debug("progress not relayed: %s", exc)
            self._signals += 1
            fast = self._signals < self.FAST_SIGNALS
            await asyncio.sleep(self._every if fast else self.SLOW_EVERY_S)

    async def __aenter__(self) -> Self:
        if self._client is not None:
            self._task = asyncio.create_task(self._relay(self._client))
        return self


async def unless_shutting_down(work: Coroutine[Any, Any, _T]) -> _T:
    task = asyncio.ensure_future(work)
    shutdown = asyncio.ensure_future(activity.wait_for_worker_shutdown())
    try:
        await asyncio.wait({task, shutdown}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:  # the activity is cancelled: so is its work, and awaited
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise
    finally:
        shutdown.cancel()
    if task.done():
        return task.result()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    raise ApplicationError(
        f"{activity.info().activity_type} handed over: this worker is shutting down and another "
        "one continues it",
        type=SHUTTING_DOWN,
    )
