"""A job's first submit of a prompt id posts at once; every retry looks first.

Behind a backlog, `GET /queue` is megabytes of JSON per job; a first attempt of a run's own
prompt id cannot find anything there, so it skips the look. A retry still looks, so nothing is
posted twice."""

from __future__ import annotations

import dataclasses
import uuid

from temporalio.testing import ActivityEnvironment

from activities.comfyui.activities import ComfyUIActivities
from activities.comfyui.models import ComfyUISubmit, ComfyUISubmitted
from spillway.sim.comfyui import ComfyUISim
from tests.support.comfyui import submit_request
from tests.support.graphs import VIDEO_GRAPH


async def submit(acts: ComfyUIActivities, req: ComfyUISubmit, attempt: int) -> ComfyUISubmitted:
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(environment.info, attempt=attempt)
    result: ComfyUISubmitted = await environment.run(acts.submit, req)
    return result


def new_request() -> ComfyUISubmit:
    return submit_request(f"job-{uuid.uuid4().hex[:12]}", VIDEO_GRAPH)


async def test_first_attempt_of_a_runs_own_prompt_posts_without_reading_the_queue(
    comfyui: ComfyUISim, comfyui_activities
):
    comfyui.pause()
    req = new_request()
    reads = comfyui.hits["GET /queue"]
    first = await submit(comfyui_activities(), req, attempt=1)
    assert first.posted and comfyui.prompt_posts[req.prompt_id] == 1
    assert comfyui.hits["GET /queue"] == reads


async def test_a_retry_of_a_runs_own_prompt_finds_the_earlier_post_and_does_not_post_again(
    comfyui: ComfyUISim, comfyui_activities
):
    comfyui.pause()
    req = new_request()
    await submit(comfyui_activities(), req, attempt=1)
    # Another agent (no record of the first POST) retries: it looks, and finds it queued.
    again = await submit(comfyui_activities(), req, attempt=2)
    assert again == ComfyUISubmitted(prompt_id=req.prompt_id, posted=False)
    assert comfyui.prompt_posts[req.prompt_id] == 1
