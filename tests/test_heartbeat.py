"""The one heartbeat of long activities: it beats while the activity waits on something else,
always with the latest details, on entry only when it has some, and what must reach the server
can be beaten at once."""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from temporalio.testing import ActivityEnvironment

from activities.heartbeat import Heartbeat, unless_shutting_down
from spillway.core.models import Progress


async def beats_of(body: Any) -> list[Any]:
    """Runs `body()` as an activity; returns its heartbeat details (None: a beat without)."""
    beats: list[Any] = []
    environment = ActivityEnvironment()
    environment.on_heartbeat = lambda *details: beats.append(details[0] if details else None)
    await environment.run(body)
    return beats


async def test_beats_at_once_and_keeps_beating_while_a_request_hangs():
    async def slow_request() -> None:
        async with Heartbeat(0.02, Progress(phase="creating")):
            await asyncio.sleep(0.2)  # a request that takes ten beats

    beats = await beats_of(slow_request)
    assert beats[0] == Progress(phase="creating")
    assert len(beats) >= 5
    assert all(beat == Progress(phase="creating") for beat in beats)


async def test_without_details_beats_bare_until_something_is_known():
    async def waiting() -> None:
        async with Heartbeat(0.02) as heartbeat:
            await asyncio.sleep(0.05)
            heartbeat.update(Progress(phase="queued"))
            await asyncio.sleep(0.05)

    beats = await beats_of(waiting)
    assert beats[0] is None
    assert beats[-1] == Progress(phase="queued")
    assert beats.index(Progress(phase="queued")) > beats.index(None)


async def test_update_now_beats_the_change_before_the_next_regular_beat():
    async def polling() -> None:
        async with Heartbeat(60.0, Progress(phase="polling")) as heartbeat:
            heartbeat.update(Progress(phase="Processing"), now=True)
            heartbeat.update(Progress(phase="Processing", percent=50.0))  # waits for a beat
            assert heartbeat.details == Progress(phase="Processing", percent=50.0)
            await asyncio.sleep(0)

    beats = await beats_of(polling)
    assert beats == [Progress(phase="polling"), Progress(phase="Processing")]


async def test_a_block_without_details_that_ends_before_the_first_beat_sends_none():
    async def quick() -> None:
        async with Heartbeat(0.5) as heartbeat:
            heartbeat.update(Progress(phase="downloaded"))

    assert await beats_of(quick) == []


async def test_without_details_the_first_urgent_update_is_the_first_beat():
    async def submitting() -> None:
        async with Heartbeat(60.0) as heartbeat:
            heartbeat.update(Progress(phase="looking"))
            heartbeat.update(Progress(phase="posting"), now=True)

    assert await beats_of(submitting) == [Progress(phase="posting")]


async def test_beats_stop_when_the_block_ends_even_by_an_error():
    beats: list[Any] = []

    async def failing() -> None:
        try:
            async with Heartbeat(0.01, Progress(phase="downloading")):
                raise RuntimeError("connection dropped")
        except RuntimeError:
            pass
        stopped = len(beats)
        await asyncio.sleep(0.05)
        assert len(beats) == stopped

    environment = ActivityEnvironment()
    environment.on_heartbeat = lambda *details: beats.append(details[0] if details else None)
    await environment.run(failing)


async def test_an_activity_cancelled_while_it_waits_cancels_its_work_and_waits_for_it():
    # A job cancelled while it renders: its ComfyUI wait must end with the activity, never run
    # on as a task nobody awaits ("Task exception was never retrieved").
    started, ended = asyncio.Event(), asyncio.Event()

    async def work() -> None:
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            ended.set()

    async def waits() -> None:
        await unless_shutting_down(work())

    environment = ActivityEnvironment()
    running = asyncio.ensure_future(environment.run(waits))
    await started.wait()
    environment.cancel()
    with contextlib.suppress(BaseException):
        await running
    assert ended.is_set()
