"""The GPU line on the real dev server with the worker and its agent, the ComfyUI double as the
one host: the `spillway` fixture, a sampler of what ComfyUI itself held, and what tests do to
the pool and its jobs (terminate, reset, read their histories)."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from spillway.client import jobs as job_ops
from spillway.client.queue import pool_view
from spillway.core import names
from spillway.core.gpu_pool import PoolView
from spillway.core.models import CloudRequest, Plan, VideoJob
from spillway.core.settings import Settings
from spillway.core.tiers import load_tiers
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import Jobs, pool_settled
from tests.support.settings import comfyui_values, make_settings, minimax_values
from tests.support.waiting import until
from worker import serving


class Sampler:
    """The most prompts the ComfyUI doubles held at once (running + pending), read every 10 ms."""

    def __init__(self, *sims: ComfyUISim) -> None:
        self.sims, self.most = sims, 0

    async def run(self) -> None:
        while True:
            held = sum(len(s.queue_running) + len(s.queue_pending) for s in self.sims)
            self.most = max(self.most, held)
            await asyncio.sleep(0.01)


class Spillway:
    def __init__(self, client: Client, settings: Settings) -> None:
        self.client, self.settings = client, settings
        self.queue = settings.SPILLWAY_TASK_QUEUE
        self.jobs = Jobs(client, self.queue)

    async def start(
        self,
        *,
        cloud: bool = True,
        priority: int = 3,
        job_id: str | None = None,
        team: str | None = None,
    ) -> WorkflowHandle[Any, Plan]:
        job = VideoJob(
            job_id=job_id or f"adm-{uuid.uuid4().hex[:10]}",
            graph=VIDEO_GRAPH,
            cloud=CloudRequest(prompt="a lighthouse at dusk") if cloud else None,
            priority=priority,
            team=team,
        )
        return await job_ops.submit(self.client, job, self.queue)

    async def view(self) -> PoolView:
        return await pool_view(self.client, self.queue)

    async def holder_and_next(self) -> tuple[WorkflowHandle[Any, Plan], WorkflowHandle[Any, Plan]]:
        """A local job holding the one place (its prompt pending in a paused ComfyUI) and the
        next one in line behind it."""
        holder = await self.start(cloud=False)
        await self.jobs.until(holder, "running_local")
        nxt = await self.start(cloud=False)
        await self.line_is(lambda line: line == [nxt.id])
        return holder, nxt

    async def settled(self) -> PoolView:
        return await pool_settled(self.client, self.queue)

    async def line(self) -> list[str]:
        return [i.job_id for i in (await self.view()).line]

    async def line_is(self, want: Callable[[list[str]], bool]) -> list[str]:
        return await until(self.line, want, timeout_s=30, what="the GPU line")


@pytest.fixture(name="spillway")
def spillway_fixture(
    dev_env: WorkflowEnvironment, comfyui: ComfyUISim, minimax: MiniMaxSim, gpu: Any, tmp_path: Path
) -> Callable[..., Any]:
    return spillway_on(dev_env, comfyui, minimax, gpu, tmp_path)


def spillway_on(
    env: WorkflowEnvironment, comfyui: ComfyUISim, minimax: MiniMaxSim, gpu: Any, tmp_path: Path
) -> Callable[..., Any]:
    """The `spillway` fixture's worker on `env`, a dev server of a test's own."""
    comfyui.execution_s = 1.0

    @asynccontextmanager
    async def run(tiers: Path | None = None, **overrides: Any) -> AsyncIterator[Spillway]:
        values = comfyui_values(comfyui, tmp_path / "out") | minimax_values(minimax, tmp_path / "o")
        if tiers is not None:
            values["SPILLWAY_ROUTING_TIERS"] = tiers
        settings = make_settings(
            values, **{"SPILLWAY_TASK_QUEUE": f"adm-{uuid.uuid4()}"} | overrides
        )
        async with serving(
            env.client, settings, load_tiers(settings.SPILLWAY_ROUTING_TIERS), gpu=gpu
        ):
            yield Spillway(env.client, settings)

    return run


@asynccontextmanager
async def sampling(*sims: ComfyUISim) -> AsyncIterator[Sampler]:
    sampler = Sampler(*sims)
    task = asyncio.create_task(sampler.run())
    try:
        yield sampler
    finally:
        task.cancel()


def posted(sim: ComfyUISim, plan: Plan) -> int:
    return sim.prompt_posts[plan.prompt_id] if plan.prompt_id else 0


async def admitted_asks(run: WorkflowHandle[Any, Any]) -> list[str]:
    """The asks (their `asked_at`) a run's history says the pool gave a place to."""
    found = []
    async for event in run.fetch_history_events():
        signal = event.workflow_execution_signaled_event_attributes
        if signal.signal_name == names.POOL_ANSWER:
            answer = json.loads(signal.input.payloads[0].data)
            if answer.get("host") is not None:
                found.append(answer["asked_at"])
    return found


async def reset_to_after_its_admission(client: Client, job_id: str) -> str:
    """The job reset to the workflow task after the GPU pool's answer that admitted it; the
    new run's id."""
    handle = client.get_workflow_handle(job_id)
    events = (await handle.fetch_history()).events
    answered = next(
        e.event_id
        for e in events
        if e.workflow_execution_signaled_event_attributes.signal_name == names.POOL_ANSWER
    )
    task = next(
        e.event_id
        for e in events
        if e.event_id > answered and e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    reset = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=job_id),
            reason="test: an operator resets a job to after its admission",
            workflow_task_finish_event_id=task,
            request_id=str(uuid.uuid4()),
        )
    )
    return reset.run_id


async def terminate_pool(sw: Spillway) -> str:
    """The operator's remedy for a wedged pool; the run it ended."""
    pool = sw.client.get_workflow_handle(names.pool_id(sw.queue))
    run_id = (await pool.describe()).run_id
    await pool.terminate(reason="operator")
    return run_id or ""


async def checks_done(client: Client, pool_id: str) -> int:
    """The activities (holder checks, places read) the pool's current run has completed."""
    done = 0
    async for event in client.get_workflow_handle(pool_id).fetch_history_events():
        done += event.HasField("activity_task_completed_event_attributes")
    return done
