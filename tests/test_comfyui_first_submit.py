"""A job's first submit of a prompt id of its own run posts at once; every retry looks first.

Behind a backlog, `GET /queue` is megabytes of JSON per job; a first attempt of a run's own
prompt id cannot find anything there, so it skips the look. A retry, or a prompt id from before
ids were unique per run, still looks, so nothing is posted twice."""

from __future__ import annotations

import dataclasses
import uuid

from temporalio.testing import ActivityEnvironment

from activities.comfyui import ComfyUIActivities
from spillway.comfyui_models import ComfyUISubmit, ComfyUISubmitted
from spillway.sim.comfyui import ComfyUISim
from tests.support.comfyui import submit_request
from tests.support.graphs import VIDEO_GRAPH


async def submit(acts: ComfyUIActivities, req: ComfyUISubmit, attempt: int) -> ComfyUISubmitted:
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(environment.info, attempt=attempt)
    result: ComfyUISubmitted = await environment.run(acts.submit, req)
    return result


def own_run_request() -> ComfyUISubmit:
    req = submit_request(f"job-{uuid.uuid4().hex[:12]}", VIDEO_GRAPH)
    return req.model_copy(update={"own_run": True})


async def test_first_attempt_of_a_runs_own_prompt_posts_without_reading_the_queue(
    comfyui: ComfyUISim, comfyui_activities
):
    comfyui.pause()
    req = own_run_request()
    reads = comfyui.hits["GET /queue"]
    first = await submit(comfyui_activities(), req, attempt=1)
    assert first.posted and comfyui.prompt_posts[req.prompt_id] == 1
    assert comfyui.hits["GET /queue"] == reads


async def test_a_retry_of_a_runs_own_prompt_finds_the_earlier_post_and_does_not_post_again(
    comfyui: ComfyUISim, comfyui_activities
):
    comfyui.pause()
    req = own_run_request()
    await submit(comfyui_activities(), req, attempt=1)
    # Another agent (no record of the first POST) retries: it looks, and finds it queued.
    again = await submit(comfyui_activities(), req, attempt=2)
    assert again == ComfyUISubmitted(prompt_id=req.prompt_id, posted=False)
    assert comfyui.prompt_posts[req.prompt_id] == 1


async def test_a_prompt_id_from_before_ids_per_run_is_looked_for_even_on_a_first_attempt(
    comfyui: ComfyUISim, comfyui_activities
):
    comfyui.pause()
    req = own_run_request().model_copy(update={"own_run": False})
    await submit(comfyui_activities(), req, attempt=1)
    # A reset run of an old job reuses the id: it finds the earlier run's prompt.
    again = await submit(comfyui_activities(), req, attempt=1)
    assert again == ComfyUISubmitted(prompt_id=req.prompt_id, posted=False)
    assert comfyui.prompt_posts[req.prompt_id] == 1
