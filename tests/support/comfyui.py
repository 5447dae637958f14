"""The LOCAL route's double and inputs; loaded by conftest.

- `comfyui`: the ComfyUI double on loopback, an A40 with the seed's free-GPU reading
  (FREE_VRAM_PCT of its VRAM used, an empty queue); tests set its timing (`execution_s`, ...).
  It is a `ComfyUIDouble`: spillway.sim.comfyui's double plus what only tests need (a POST
  /prompt queued late, sockets dropped, newer ComfyUI's job cancel endpoint).
- `comfyui_activities(**overrides)`: ComfyUIActivities on `comfyui_settings`, heartbeating often,
  closed (their ComfyUI watcher stopped) when the test ends. Upper-case keywords are settings,
  lower-case ones go to ComfyUIActivities (`heartbeat_every_s`, `post_grace_s`, ...).
- `submit_request(job_id, graph)`, `wait_request(submit)`: the activities' inputs for a graph
  (tests/support/graphs.py); `submit_new_job(acts, graph)`: a graph under a new job id, through
  the submit activity, returning its request; `submit_new_job_until(acts, graph, comfyui, state)`
  returns once ComfyUI holds that prompt in `state` ("running", "done").
- `ESCAPING_OUTPUTS`: (subfolder, filename) of outputs that would land outside the job's folder.
"""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest
from aiohttp import web

from activities.comfyui.activities import ComfyUIActivities
from activities.comfyui.models import ComfyUISubmit, ComfyUIWait, prompt_id_for
from spillway.sim.comfyui import ComfyUISim, PromptState
from tests.support.activity import run_activity
from tests.support.constants import FREE_VRAM_PCT
from tests.support.settings import SettingsFactory


class ComfyUIDouble(ComfyUISim):
    """Knobs: `late_prompt_posts` POSTs /prompt are queued (and answered) only `late_prompt_s`
    after their body arrived, as by a ComfyUI slow to validate: a client that gave up meanwhile
    never hears of it. `drop_sockets()` closes every WebSocket from ComfyUI's side. `jobs_api`:
    answer `POST /api/jobs/{id}/cancel` as newer ComfyUI does (0.3.64, the default, answers 404).
    `history_s`: each `GET /history/{id}` takes that long; `most_history_reads` is the most it
    answered at once."""

    def __init__(self) -> None:
        super().__init__()
        self.late_prompt_posts = 0
        self.late_prompt_s = 0.0
        self.jobs_api = False
        self.history_s = 0.0
        self.most_history_reads = 0
        self._history_reads = 0

    def add_routes(self, app: web.Application) -> None:
        super().add_routes(app)
        app.router.add_post("/api/jobs/{prompt_id}/cancel", self._cancel_job)

    async def drop_sockets(self) -> None:
        for ws in list(self._sockets.values()):
            await ws.close()

    async def _post_prompt(self, request: web.Request) -> web.Response:
        if self.late_prompt_posts > 0:
            self.late_prompt_posts -= 1
            await request.read()  # ComfyUI has the whole request; the client waits for an answer
            await asyncio.sleep(self.late_prompt_s)
        return await super()._post_prompt(request)

    async def _history_one(self, request: web.Request) -> web.Response:
        self._history_reads += 1
        self.most_history_reads = max(self.most_history_reads, self._history_reads)
        try:
            await asyncio.sleep(self.history_s)
            return await super()._history_one(request)
        finally:
            self._history_reads -= 1

    async def _cancel_job(self, request: web.Request) -> web.Response:
        if not self.jobs_api:
            return web.Response(status=404, text="404: Not Found")  # aiohttp's unknown route
        prompt_id = request.match_info["prompt_id"]
        if any(item[1] == prompt_id for item in self.queue_running):
            self._interrupt = True  # stops at the next node boundary, as /interrupt does
        self.queue_pending = [i for i in self.queue_pending if i[1] != prompt_id]
        self._touch()
        return web.json_response({"id": prompt_id, "cancelled": True})


RUN_ID = "0193f2a4-run-of-a-test"  # the run a submit's prompt id is of


def submit_request(job_id: str, graph: dict[str, Any], attempt: int = 1) -> ComfyUISubmit:
    return ComfyUISubmit(
        job_id=job_id, prompt_id=prompt_id_for(job_id, attempt, RUN_ID), graph=graph
    )


def wait_request(submit: ComfyUISubmit) -> ComfyUIWait:
    return ComfyUIWait(job_id=submit.job_id, prompt_id=submit.prompt_id)


async def submit_new_job(acts: ComfyUIActivities, graph: dict[str, Any]) -> ComfyUISubmit:
    req = submit_request(f"job-{uuid.uuid4().hex[:12]}", graph)
    await run_activity(acts.submit, req)
    return req


async def submit_new_job_until(
    acts: ComfyUIActivities, graph: dict[str, Any], comfyui: ComfyUISim, state: PromptState
) -> ComfyUISubmit:
    req = await submit_new_job(acts, graph)
    await comfyui.wait_until(req.prompt_id, state)
    return req


ESCAPING_OUTPUTS = [
    ("", "../../escaped.mp4"),
    ("../..", "escaped.mp4"),
    ("/etc", "passwd"),
    ("video", ".hidden"),
    ("", "a/../../b.mp4"),
    ("..\\..", "escaped.mp4"),
    ("", ""),
]


@pytest.fixture
async def comfyui() -> AsyncIterator[ComfyUIDouble]:
    async with ComfyUIDouble() as sim:
        sim.set_vram_used_pct(FREE_VRAM_PCT)
        yield sim


@pytest.fixture
async def comfyui_activities(
    http: httpx.AsyncClient, comfyui_settings: SettingsFactory
) -> AsyncIterator[Callable[..., ComfyUIActivities]]:
    made: list[ComfyUIActivities] = []

    def make(**overrides: Any) -> ComfyUIActivities:
        options: dict[str, Any] = {"heartbeat_every_s": 0.05}
        options |= {k: v for k, v in overrides.items() if k.islower()}
        settings = comfyui_settings(**{k: v for k, v in overrides.items() if not k.islower()})
        acts = ComfyUIActivities(http, settings, **options)
        made.append(acts)
        return acts

    yield make
    for acts in made:  # as the worker does on shutdown: the watchers' sockets and polls stop
        await acts.aclose()


def prompts_of(comfyui: ComfyUISim, job_id: str, attempt: int = 1) -> list[str]:
    """The prompt ids ComfyUI received for a job's attempt (ids carry the run: unique per run)."""
    pattern = re.compile(rf"spillway-{re.escape(job_id)}-(?:[0-9a-f]{{16}}-)?{attempt}")
    return [p for p in comfyui.prompt_posts if pattern.fullmatch(p)]


def posts_for(comfyui: ComfyUISim, job_id: str, attempt: int = 1) -> int:
    """POST /prompt that reached ComfyUI for a job's attempt (whatever run posted it)."""
    return sum(comfyui.prompt_posts[p] for p in prompts_of(comfyui, job_id, attempt))
