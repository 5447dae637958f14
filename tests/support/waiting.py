"""The one way a test waits: `until(read, good)` reads again until the reading is good and
returns it, or fails saying what it waited for and what it read last. A scale scenario, whose
pace is the machine's, waits with `until_all(count, total)`: it fails only when the count stops
growing.

    await until(lambda: minimax.create_bodies)                       # a condition
    plan = await until(lambda: jobs.status(job_id), lambda p: p.route is not None)  # a reading
    await until_all(lambda: ended(queue), 200)                        # progress
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar, overload

T = TypeVar("T")


@overload
async def until(
    read: Callable[[], Awaitable[T]],
    good: Callable[[T], object] = ...,
    *,
    timeout_s: float = ...,
    every_s: float = ...,
    what: str | None = ...,
) -> T: ...


@overload
async def until(
    read: Callable[[], T],
    good: Callable[[T], object] = ...,
    *,
    timeout_s: float = ...,
    every_s: float = ...,
    what: str | None = ...,
) -> T: ...


async def until(
    read: Callable[[], Any],
    good: Callable[[Any], object] = bool,
    *,
    timeout_s: float = 30.0,
    every_s: float = 0.05,
    what: str | None = None,
) -> Any:
    """Calls `read` (a function or a coroutine function) every `every_s` seconds until
    `good(reading)` is true; the good reading. Past `timeout_s` (wall clock, a hanging read
    included) it fails with an AssertionError naming `what` (by default the line that called
    it) and the last reading."""
    reading: Any = None
    reads = 0
    scope = asyncio.timeout(timeout_s)
    try:
        async with scope:
            while True:
                answer = read()
                if inspect.isawaitable(answer):
                    answer = await answer
                reading, reads = answer, reads + 1
                if good(reading):
                    return reading
                await asyncio.sleep(every_s)
    except TimeoutError:
        if not scope.expired():
            raise  # the read itself timed out: its own error says more
        waited_for = what or _caller()
        last = f"last reading: {reading!r}" if reads else "no read returned"
        raise AssertionError(
            f"waited {timeout_s:g} s for {waited_for}; {reads} reads, {last}"
        ) from None


async def until_all(
    count: Callable[[], Any],
    total: int,
    *,
    stall_s: float = 300.0,
    every_s: float = 0.5,
    what: str | None = None,
) -> None:
    """Reads `count` (a function or a coroutine function) until it reaches `total`. A busy
    machine only slows the count down: this fails when it has not grown for `stall_s` (wall
    clock), naming `what` and the count it stopped at, however long the whole takes. The first
    step includes the scenario's start-up: the 300-job scenario's first job took over 120 s to
    end on a machine running three suites at once."""
    what = what or _caller()
    done = -1
    while done < total:
        last = done

        def moved(n: int, last: int = last) -> bool:
            return n >= total or n > last

        done = await until(
            count,
            moved,
            timeout_s=stall_s,
            every_s=every_s,
            what=f"{what} to go on from {last} of {total}",
        )


def _caller() -> str:
    """Where `until` was called from (its source line), as the description of what it waited
    for."""
    for frame in inspect.stack()[2:]:
        if frame.filename != __file__:
            line = frame.code_context[0].strip() if frame.code_context else "the condition"
            return f"{line} ({frame.filename}:{frame.lineno})"
    return "the condition"
