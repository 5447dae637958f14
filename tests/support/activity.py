"""`run_activity(fn, arg)`: one activity run outside a worker, in Temporal's ActivityEnvironment,
as the tests of the ComfyUI and MiniMax activities use it; loaded by conftest. It returns
`(result or the exception raised, heartbeats)`, one entry per heartbeat: its details, or None
for a heartbeat without details."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from temporalio.testing import ActivityEnvironment

RunActivity = Callable[[Callable[[Any], Awaitable[Any]], Any], Awaitable[tuple[Any, list[Any]]]]


async def run_activity(fn: Callable[[Any], Awaitable[Any]], arg: Any) -> tuple[Any, list[Any]]:
    heartbeats: list[Any] = []
    environment = ActivityEnvironment()
    environment.on_heartbeat = lambda *details: heartbeats.append(details[0] if details else None)
    try:
        result: Any = await environment.run(fn, arg)
    except Exception as exc:
        result = exc
    return result, heartbeats


@pytest.fixture(name="run_activity")
def run_activity_fixture() -> RunActivity:
    return run_activity
