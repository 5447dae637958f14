"""A job's first submit of a prompt id posts at once; every retry looks first.

Behind a backlog, `GET /queue` is megabytes of JSON per job; a first attempt of a run's own
prompt id cannot find anything there, so it skips the look. A retry still looks, so nothing is
posted twice."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

import pytest
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.comfyui.activities import ComfyUIActivities
from activities.comfyui.models import NO_POOL, ComfyUISubmit, ComfyUISubmitted
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


@pytest.mark.full
async def test_with_no_pool_a_first_submit_posts_nothing_and_a_retry_follows_what_was_posted(
    comfyui: ComfyUISim, comfyui_activities, dev_env: WorkflowEnvironment
):
    """The place is confirmed with the running GPU pool before a POST; none runs here. A first
    attempt posts nothing; a retry whose earlier attempt posted without a heartbeat saying so
    (its worker died) finds the prompt and follows it rather than say nothing was posted."""
    comfyui.pause()
    queue = f"no-pool-{uuid.uuid4().hex[:8]}"
    req = new_request().model_copy(
        update={
            "place_on": "a40_local",
            "place_asked_at": datetime.now(UTC),
            "jobs_queue": queue,
        }
    )
    acts = comfyui_activities(temporal=dev_env.client)
    with pytest.raises(ApplicationError) as refused:
        await submit(acts, req, attempt=1)
    assert refused.value.type == NO_POOL and req.prompt_id not in comfyui.prompt_posts
    await submit(comfyui_activities(), req, attempt=1)  # an attempt that posted, unconfirmed
    again = await submit(comfyui_activities(temporal=dev_env.client), req, attempt=2)
    assert again == ComfyUISubmitted(prompt_id=req.prompt_id, posted=False)
    assert comfyui.prompt_posts[req.prompt_id] == 1
