"""`run_activity(fn, arg, **info)`: one activity run outside a worker, in Temporal's
ActivityEnvironment, as the tests of the ComfyUI, MiniMax and Kling activities use it; loaded by
conftest. It returns `(result or the exception raised, heartbeats)`, one entry per heartbeat: its
details, or None for a heartbeat without details. `info` changes the activity's info from the
default (`attempt=2`: another attempt of the same run; `workflow_run_id`: another run). An
argument with a `job_id` runs as that spillway job's activity would (its workflow id and type),
which the cloud creates check.

`cancelled_in_flight(fn, arg, sent)`: the activity cancelled, as by a worker shutting down, once
`sent()` says its request is out; the ApplicationError it ended with."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from spillway.core import names
from tests.support.waiting import until

RunActivity = Callable[[Callable[[Any], Awaitable[Any]], Any], Awaitable[tuple[Any, list[Any]]]]


async def run_activity(
    fn: Callable[[Any], Awaitable[Any]], arg: Any, **info: Any
) -> tuple[Any, list[Any]]:
    heartbeats: list[Any] = []
    environment = as_job(arg)
    environment.info = dataclasses.replace(environment.info, **info)
    environment.on_heartbeat = lambda *details: heartbeats.append(details[0] if details else None)
    try:
        result: Any = await environment.run(fn, arg)
    except Exception as exc:
        result = exc
    return result, heartbeats


async def cancelled_in_flight(
    fn: Callable[[Any], Awaitable[Any]], arg: Any, sent: Callable[[], object]
) -> ApplicationError:
    environment = as_job(arg)
    running = asyncio.ensure_future(environment.run(fn, arg))
    await until(sent)
    environment.cancel()
    with pytest.raises(ApplicationError) as raised:
        await running
    return raised.value


def as_job(arg: Any) -> ActivityEnvironment:
    environment = ActivityEnvironment()
    job_id = getattr(arg, "job_id", None)
    if isinstance(job_id, str):
        environment.info = dataclasses.replace(
            environment.info, workflow_id=job_id, workflow_type=names.VIDEO_JOB
        )
    return environment


@pytest.fixture(name="run_activity")
def run_activity_fixture() -> RunActivity:
    return run_activity
