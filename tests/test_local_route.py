"""The LOCAL route end to end: VideoJobWorkflow with the real activities against the ComfyUI
double (success with the video home, rejected graph, execution error, silent socket, ComfyUI
restart, cancel), and exactly-once submit with a real worker process killed mid-submit."""

from __future__ import annotations

import asyncio
import hashlib
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.comfyui.models import prompt_id_for
from spillway.core.models import Plan
from spillway.core.names import run_tag
from spillway.core.settings import Settings
from spillway.core.tiers import load_tiers
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.comfyui_run import Failure
from tests.support.comfyui import posts_for
from tests.support.graphs import SLOW_GRAPH, VIDEO_GRAPH, graph_without
from tests.support.jobs import Jobs
from tests.support.waiting import until
from worker import serving
from workflows.video_job import VideoJobWorkflow

Start = Callable[..., "asyncio.Future[WorkflowHandle[Any, Plan]]"]


@pytest.fixture
def local_jobs(dev_env: WorkflowEnvironment, comfyui_settings, http, gpu, comfyui: ComfyUISim):
    """A worker with every real activity on the real dev server (the time-skipping test server
    answers ACTIVITY_UNKNOWN when a workflow cancels a running ComfyUI wait); the A40 is free,
    so every job goes local."""
    env = dev_env
    comfyui.execution_s = 0.3

    @asynccontextmanager
    async def run(**overrides: Any) -> AsyncIterator[Callable[..., Any]]:
        queue = f"local-{uuid.uuid4()}"
        settings: Settings = comfyui_settings(
            SPILLWAY_HEARTBEAT_TIMEOUT_S=2, SPILLWAY_TASK_QUEUE=queue, **overrides
        )
        tiers = load_tiers(settings.SPILLWAY_ROUTING_TIERS)
        jobs = Jobs(env.client, queue)
        async with serving(env.client, settings, tiers, gpu=gpu):

            async def start(graph: dict[str, Any] = VIDEO_GRAPH) -> WorkflowHandle[Any, Plan]:
                return await jobs.start(prompt=None, graph=graph)  # no cloud request

            yield start

    return run


def failure(failed: pytest.ExceptionInfo[WorkflowFailureError]) -> str:
    assert isinstance(failed.value.cause, ApplicationError)
    return failed.value.cause.message


async def test_a_local_job_brings_the_video_home_with_its_sha256(local_jobs, comfyui):
    async with local_jobs() as start:
        handle = await start()
        plan: Plan = await handle.result()
    assert (plan.state, plan.route, plan.local_attempts) == ("completed", "local", 1)
    [video] = plan.outputs
    path = Path(video.path)
    assert path.suffix == ".mp4" and path.name.startswith("job_")
    assert video.sha256 == comfyui.expected_sha256(path.name, "video")
    assert video.sha256 == hashlib.sha256(await asyncio.to_thread(path.read_bytes)).hexdigest()
    assert posts_for(comfyui, handle.id) == 1


async def test_a_rejected_graph_fails_once_naming_the_node(local_jobs, comfyui):
    async with local_jobs() as start:
        handle = await start(graph_without(VIDEO_GRAPH, "2", "fps"))
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    assert "node 2 (CreateVideo)" in failure(failed) and "fps" in failure(failed)
    assert posts_for(comfyui, handle.id) == 1


async def test_an_execution_error_fails_the_job_with_comfyuis_message(local_jobs, comfyui):
    comfyui.fail_next(
        Failure(message="CUDA out of memory", exception_type="torch.OutOfMemoryError")
    )
    async with local_jobs() as start:
        with pytest.raises(WorkflowFailureError) as failed:
            await (await start()).result()
    assert "CUDA out of memory" in failure(failed)


async def test_a_socket_gone_silent_still_finishes_through_the_history_poll(local_jobs, comfyui):
    comfyui.ws_silent_after = 1
    async with local_jobs() as start:
        plan: Plan = await (await start()).result()
    assert plan.state == "completed" and comfyui.ws_withheld > 0


async def test_a_comfyui_restart_mid_job_resubmits_once_and_succeeds(local_jobs, comfyui):
    comfyui.execution_s = 2.0
    async with local_jobs() as start:
        handle = await start()
        first = prompt_id_for(handle.id, 1, run_tag(handle.first_execution_run_id or ""))
        await comfyui.wait_until(first, "running")
        await comfyui.restart()
        plan: Plan = await handle.result()
    assert (plan.state, plan.local_attempts) == ("completed", 2)
    assert f"comfyui_lost_prompt={first}" in plan.reasons
    assert comfyui.prompt_posts[first] == 1
    second = prompt_id_for(handle.id, 2, run_tag(handle.first_execution_run_id or ""))
    assert comfyui.prompt_posts[second] == 1


@pytest.mark.parametrize("where", ["pending", "running"])
async def test_cancelling_removes_the_prompt_from_comfyui(local_jobs, comfyui, where):
    comfyui.execution_s = 30.0
    if where == "pending":
        comfyui.pause()
    async with local_jobs() as start:
        handle = await start(SLOW_GRAPH)
        prompt = prompt_id_for(handle.id, 1, run_tag(handle.first_execution_run_id or ""))
        await comfyui.wait_until(prompt, where)
        await handle.cancel()
        with pytest.raises(WorkflowFailureError):
            await handle.result()
        plan: Plan = await handle.query(VideoJobWorkflow.plan)
    assert plan.state == "cancelled"
    assert f"comfyui_prompt_{where}_cancelled" in plan.reasons
    assert comfyui.state_of(prompt) not in ("pending", "running")


async def test_a_worker_killed_right_after_the_post_never_posts_twice(
    worker_process, dev_env, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.3
    comfyui.hang_prompt_answers = 1  # queued, then the worker dies waiting for the answer
    worker = await worker_process(COMFYUI_URL=comfyui.url, COMFYUI_HISTORY_POLL_S="0.2")
    handle = await Jobs(dev_env.client, worker.task_queue).start(prompt=None)
    prompt = prompt_id_for(handle.id, 1, run_tag(handle.first_execution_run_id or ""))
    await until(lambda: comfyui.prompt_posts[prompt] >= 1, timeout_s=30)
    await worker.kill()
    await worker.start()
    plan: Plan = await asyncio.wait_for(handle.result(), 90)
    assert plan.state == "completed" and plan.local_attempts == 1
    assert comfyui.prompt_posts[prompt] == 1
