"""Waits with a timeout that never cancel their timer.

`workflow.wait_condition(..., timeout=...)` cancels its timer when woken first. When that timer
fires while the very workflow task that cancels it is with the worker, Temporal's server fails
the task and sends it again with the timer fired; its time-skipping test server instead refuses
the completion and strands the run for good ("invalid history builder state for action",
temporalio/sdk-java#3088). Timers of different workflows fall within milliseconds of each other
whenever their intervals are multiples (a job's 5-minute line check, the pool's 1-minute probe),
so a signal sent at one timer woke the other workflow just before its own fired. A wait made
here leaves its timer to fire (one workflow task that changes nothing) and shares it with the
next wait for the same instant.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from datetime import datetime, timedelta

from temporalio import workflow

NEVER_CANCELLED = "timers-never-cancelled"  # patch: a run before it cancels its timers


class Alarms:
    """The timers one workflow run has started and not yet seen fire, by due time."""

    def __init__(self) -> None:
        self._due: dict[datetime, asyncio.Task[None]] = {}

    async def wait(self, woken: Callable[[], bool], at_most: timedelta | None) -> bool:
        """`wait_condition(woken, timeout=at_most)`: True once woken, False when `at_most`
        passed first."""
        if at_most is None:
            await workflow.wait_condition(woken)
            return True
        if not workflow.patched(NEVER_CANCELLED):
            try:
                await workflow.wait_condition(woken, timeout=at_most)
            except TimeoutError:
                return False
            return True
        due = workflow.now() + at_most
        timer = self._due.get(due)
        if timer is None:
            timer = asyncio.create_task(workflow.sleep(at_most))
            self._due[due] = timer
            timer.add_done_callback(lambda _: self._due.pop(due, None))
        fired = timer
        await workflow.wait_condition(lambda: woken() or fired.done())
        return woken()
