"""Image-to-video, outputs in object storage and priority, end to end: VideoJobWorkflow with the
real activities on the dev server, started through `spillway.client` as a studio service
would; the ComfyUI and MiniMax doubles, and moto's S3 on 127.0.0.1."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import pytest
from aiohttp import web
from temporalio.api.enums.v1 import EventType
from temporalio.testing import WorkflowEnvironment

from spillway.client import SpillwayClient
from spillway.core.models import Plan
from spillway.core.settings import Settings
from spillway.core.tiers import load_tiers
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.constants import BUSY_VRAM_PCT
from tests.support.graphs import VIDEO_GRAPH
from tests.support.images import I2V_GRAPH, jpeg, png
from tests.support.settings import comfyui_values, make_settings, minimax_values
from tests.support.waiting import until
from worker import serving

if TYPE_CHECKING:
    from tests.support.s3 import S3Endpoint

pytest_plugins = ["tests.support.s3"]


@pytest.fixture
def spillway_at(dev_env: WorkflowEnvironment, comfyui: ComfyUISim, minimax: MiniMaxSim, gpu):
    """A worker with its agent (every real activity) and a client of the same settings."""
    comfyui.execution_s = 0.05

    @asynccontextmanager
    async def run(tmp: Path, **overrides: Any) -> AsyncIterator[SpillwayClient]:
        queue = f"i2v-{uuid.uuid4()}"
        values = comfyui_values(comfyui, tmp / "outputs") | minimax_values(minimax, tmp / "out")
        settings: Settings = make_settings(values, SPILLWAY_TASK_QUEUE=queue, **overrides)
        async with serving(
            dev_env.client, settings, load_tiers(settings.SPILLWAY_ROUTING_TIERS), gpu=gpu
        ):
            yield SpillwayClient(dev_env.client, settings=settings, task_queue=queue)

    return run


@asynccontextmanager
async def receiver(events: list[dict[str, Any]]) -> AsyncIterator[str]:
    """A callback receiver on 127.0.0.1 that keeps every event it is sent."""

    async def hook(request: web.Request) -> web.Response:
        events.append(await request.json())
        return web.Response(status=204)

    app = web.Application()
    app.router.add_post("/hook", hook)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}/hook"
    finally:
        await runner.cleanup()


def job_id() -> str:
    return f"i2v-{uuid.uuid4().hex[:10]}"


async def test_an_image_to_video_job_renders_its_image_and_its_video_downloads_from_the_bucket(
    spillway_at: Callable[..., Any],
    comfyui: ComfyUISim,
    s3: S3Endpoint,
    http: httpx.AsyncClient,
    tmp_path: Path,
):
    image = png(640, 480)
    (tmp_path / "start.png").write_bytes(image)
    sha256 = hashlib.sha256(image).hexdigest()
    comfyui.lose_upload_answers = 1  # stored, then no answer: the upload is retried
    events: list[dict[str, Any]] = []
    async with (
        receiver(events) as hook,
        spillway_at(tmp_path, JOB_WEBHOOK_URL=hook, **s3.env()) as client,
    ):
        plan = await client.submit(
            I2V_GRAPH, job_id=job_id(), inputs=[f"1={tmp_path / 'start.png'}"], wait=True
        )
        shown = await client.status(plan.job_id)
        await until(lambda: events, what="the job.completed callback")

    assert (plan.state, plan.route) == ("completed", "local")
    assert comfyui.hits["POST /upload/image"] == 2
    assert comfyui.inputs.files == {f"spillway/{sha256}.png": image}  # one file for two uploads
    [entry] = (comfyui.history[p] for p in comfyui.history if p == plan.prompt_id)
    assert entry["prompt"][2]["1"]["inputs"]["image"] == f"spillway/{sha256}.png"
    assert entry["prompt"][2]["2"] == I2V_GRAPH["2"]  # the rest of the graph as it was sent
    [video] = shown.outputs
    assert video.uri is not None and video.uri.startswith(
        f"s3://{s3.bucket}/outputs/{plan.job_id}/"
    )
    assert video.sha256 == comfyui.expected_sha256(Path(video.path).name, "i2v")
    assert video.url is not None
    [event] = events
    [told] = event["plan"]["outputs"]
    for url in (video.url, told["url"]):  # status and the callback each give a working link
        fetched = await http.get(url)
        assert hashlib.sha256(fetched.content).hexdigest() == video.sha256


async def test_the_cloud_gets_the_jobs_image_as_its_first_frame(
    spillway_at: Callable[..., Any], comfyui: ComfyUISim, minimax: MiniMaxSim, tmp_path: Path
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)  # overloaded, and the fallback is armed
    image = jpeg(1280, 720)
    (tmp_path / "start.jpg").write_bytes(image)
    async with spillway_at(tmp_path, CLOUD_VIDEO_FALLBACK_ENABLED=True) as client:
        plan = await client.submit(
            I2V_GRAPH,
            job_id=job_id(),
            prompt="the harbour wakes up",
            inputs=[str(tmp_path / "start.jpg")],
            wait=True,
        )
    assert (plan.state, plan.route) == ("completed", "cloud")
    [body] = minimax.create_bodies
    encoded = base64.b64encode(image).decode("ascii")
    assert body["first_frame_image"] == f"data:image/jpeg;base64,{encoded}"
    assert comfyui.hits["POST /upload/image"] == 0  # nothing rendered locally


async def test_a_priority_1_job_behind_50_queued_jobs_starts_first(
    spillway_at: Callable[..., Any], comfyui: ComfyUISim, tmp_path: Path
):
    comfyui.pause()  # ComfyUI queues every prompt and starts none
    # Places for all 51: this is about ComfyUI's own queue, which priority 1 enters at the front
    # (the GPU line's order is tests/test_gpu_admission.py's).
    async with spillway_at(tmp_path, A40_MAX_JOBS=64) as client:
        behind = [job_id() for _ in range(50)]
        for each in behind:
            await client.submit(VIDEO_GRAPH, job_id=each, priority=3)
        await until(lambda: len(comfyui.queue_pending) == 50, timeout_s=180, what="50 queued")
        first = await client.submit(VIDEO_GRAPH, job_id=job_id(), priority=1)
        await until(lambda: len(comfyui.queue_pending) == 51, what="the priority 1 job queued")
        comfyui.resume()
        plan: Plan = await client.wait(first.job_id)
        plans = await asyncio.gather(*(client.wait(each) for each in behind))
        listed = {job.job_id: job.priority for job in await client.list()}
        history = await client.temporal.get_workflow_handle(first.job_id).fetch_history()

    assert all(p.state == "completed" for p in [plan, *plans])
    started = list(comfyui.history)  # one at a time, in the order they ran
    assert started[0] == plan.prompt_id
    assert sorted(started[1:]) == sorted(p.prompt_id for p in plans)
    assert listed[first.job_id] == 1 and {listed[each] for each in behind} == {3}
    scheduled = [
        e.activity_task_scheduled_event_attributes
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]
    # The job's priority is Temporal's for each of its activities on the GPU host's queues.
    on_host = [a for a in scheduled if "-gpu-" in a.task_queue.name]
    assert on_host and {a.priority.priority_key for a in on_host} == {1}
