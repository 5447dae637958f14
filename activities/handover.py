"""Long activities hand their work over when their worker shuts down.

A worker's shutdown grace (SPILLWAY_SHUTDOWN_GRACE_S) must outlast the longest cloud create,
which is never abandoned once sent. Waits and downloads would hold a deploy for that whole
grace; instead they stop at once with a retryable error, and another worker picks them up
(they resume safely: a wait looks at ComfyUI's history first, a download keeps finished files).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Coroutine
from typing import Any, TypeVar

from temporalio import activity
from temporalio.exceptions import ApplicationError

SHUTTING_DOWN = "WorkerShuttingDown"
_T = TypeVar("_T")


async def unless_shutting_down(work: Coroutine[Any, Any, _T]) -> _T:
    task = asyncio.ensure_future(work)
    shutdown = asyncio.ensure_future(activity.wait_for_worker_shutdown())
    try:
        await asyncio.wait({task, shutdown}, return_when=asyncio.FIRST_COMPLETED)
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
