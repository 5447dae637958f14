"""The GPU pool answers a whole line at once within Temporal's limit on a workflow's pending
signals to other workflows (docs/design.md, "GPU admission"): on a dev server of the test's own
whose limit is 10 instead of 2,000, so a line of 30 meets it as a line of thousands meets the
default, with the worker, its agent and the ComfyUI double."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment

from spillway.core import names
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from spillway.temporal import register_search_attributes
from tests.support.cli import start_dev_server
from tests.support.gpu_line import posted, spillway_on, terminate_pool
from tests.support.replay_guard import ServerGuard
from tests.support.waiting import until

pytestmark = [pytest.mark.full, pytest.mark.server]

PENDING_SIGNALS = 10  # the server's limit.numPendingSignals.error (2,000 by default)
IN_FLIGHT = 5  # SPILLWAY_POOL_SIGNALS_IN_FLIGHT
LINE = 30


@pytest.fixture
async def limited_env(request: pytest.FixtureRequest) -> AsyncIterator[WorkflowEnvironment]:
    guard = ServerGuard(f"the dev server ({PENDING_SIGNALS} pending signals)", listable=True)
    limit = f"limit.numPendingSignals.error={PENDING_SIGNALS}"
    environment = await start_dev_server(guard.interceptor, "--dynamic-config-value", limit)
    try:
        await register_search_attributes(environment.client)
        yield environment
        await guard.check(environment.client, request.config)
    finally:
        await environment.shutdown()


@pytest.fixture
def limited_spillway(
    limited_env: WorkflowEnvironment,
    comfyui: ComfyUISim,
    minimax: MiniMaxSim,
    gpu: Any,
    tmp_path: Path,
) -> Callable[..., Any]:
    return spillway_on(limited_env, comfyui, minimax, gpu, tmp_path)


async def positions_told(client: Client, job_id: str) -> list[int]:
    """The positions in line the pool's answers to the job gave, in the order they came."""
    told = []
    async for event in client.get_workflow_handle(job_id).fetch_history_events():
        signal = event.workflow_execution_signaled_event_attributes
        if signal.signal_name == names.POOL_ANSWER:
            position = json.loads(signal.input.payloads[0].data).get("position")
            if position is not None:
                told.append(position)
    return told


async def told_again(client: Client, job_id: str, answers: int) -> None:
    await until(
        lambda: positions_told(client, job_id),
        lambda told: len(told) >= answers,
        timeout_s=30,
        what=f"{job_id}'s answer number {answers}",
    )


async def test_a_line_of_30_taken_back_at_once_is_told_its_positions_and_runs_in_order(
    limited_spillway, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.2
    comfyui.pause()  # the holder's prompt stays pending: its place stays held
    async with limited_spillway(A40_MAX_JOBS=1, SPILLWAY_POOL_SIGNALS_IN_FLIGHT=IN_FLIGHT) as sw:
        holder = await sw.start(cloud=False)
        await sw.jobs.until(holder, "running_local")
        waiting = await asyncio.gather(*(sw.start(cloud=False) for _ in range(LINE - 1)))
        await sw.line_is(lambda line: len(line) == LINE - 1)
        for job in waiting:  # the answers the pool still had to send go first
            await told_again(sw.client, job.id, 1)
        await terminate_pool(sw)
        # A later job starts a new pool, which takes the line back and answers all 30 in one
        # workflow task: three times the server's limit on pending signals.
        later = await sw.start(cloud=False)
        line = await sw.line_is(lambda line: len(line) == LINE)
        assert line[-1] == later.id
        for position, job_id in enumerate(line, 1):
            await told_again(sw.client, job_id, 1 if job_id == later.id else 2)
            plan = await sw.jobs.until(job_id, "queued")
            assert plan.queue is not None and plan.queue.position == position
        comfyui.resume()
        async with asyncio.timeout(120):
            plans = await asyncio.gather(*(h.result() for h in (holder, *waiting, later)))
    by_job = {p.job_id: p for p in plans}
    assert all(p.state == "completed" and p.route == "local" for p in plans)
    assert all(posted(comfyui, p) == 1 for p in plans) and comfyui.most_held == 1
    order = list(comfyui.prompt_posts)
    assert [order.index(by_job[j].prompt_id) for j in line] == list(range(1, LINE + 1))
