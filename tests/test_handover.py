"""A wait that a shutting-down worker holds is handed over at once (a retryable error), so the
long shutdown grace a cloud create needs never holds a deploy for the length of a render."""

from __future__ import annotations

import asyncio

import pytest
from temporalio.exceptions import ApplicationError

from activities.cloud.models import CloudCreate, CloudPoll
from spillway.core.models import CloudRequest
from tests.support.activity import as_job
from tests.support.waiting import until


async def test_a_poll_hands_over_when_its_worker_shuts_down(minimax, minimax_activities):
    minimax.set_statuses(["Processing"])  # never done
    create = CloudCreate(
        job_id="job-1", request=CloudRequest(prompt="a heron"), authorisation="approved"
    )
    env = as_job(create)
    created = await env.run(minimax_activities().create, create)
    polling = asyncio.create_task(
        env.run(minimax_activities().poll, CloudPoll(job_id="job-1", task_id=created.task_id))
    )
    await until(lambda: minimax.query_hits >= 1)
    env.worker_shutdown()
    with pytest.raises(ApplicationError) as handed:
        await asyncio.wait_for(polling, 5)
    assert handed.value.type == "WorkerShuttingDown" and not handed.value.non_retryable
    assert "another one continues it" in handed.value.message
