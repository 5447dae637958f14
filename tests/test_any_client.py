"""Any Temporal client, in any language, may start a job with the JSON of VideoJob (workflow id =
job id, docs/design.md, "Clients, inputs and outputs"): input the workflow cannot accept ends
the job failed at once, naming each bad field; good JSON runs like a job from the CLI."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.exceptions import ApplicationError

from spillway.core import search_attributes as sa
from spillway.core.models import Plan
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import RunJobs
from tests.support.route_stubs import FREE, RouteStubs


@pytest.mark.parametrize(
    ("payload", "named"),
    [
        ({"job_id": "{id}", "graph": 5}, "graph: Input should be a valid dictionary"),
        ({"graph": VIDEO_GRAPH}, "job_id: Field required"),
        ({"job_id": "{id}", "graph": {"1": {"inputs": {}}}}, "has no class_type"),
        ({"job_id": "other-id", "graph": VIDEO_GRAPH}, "is not the workflow id"),
        ("not a job", "Input should be a valid dictionary"),
        (
            {"job_id": "{id}", "graph": VIDEO_GRAPH, "priority": 9},
            "priority: Input should be less than or equal to 5",
        ),
        (
            {"job_id": "{id}", "graph": VIDEO_GRAPH, "callback_url": "ftp://h/t0ken-42"},
            "callback_url: String should match pattern",
        ),
    ],
    ids=[
        "graph not a graph",
        "no job id",
        "not an API graph",
        "id mismatch",
        "a string",
        "priority out of range",
        "callback not http",
    ],
)
async def test_input_no_job_can_have_fails_at_once_naming_the_field(
    run_jobs: RunJobs, payload: object, named: str
):
    job_id = f"raw-{uuid.uuid4().hex[:10]}"
    if isinstance(payload, dict) and payload.get("job_id") == "{id}":
        payload = payload | {"job_id": job_id}
    stubs = RouteStubs(FREE)
    async with run_jobs(stubs) as jobs:
        handle = await jobs.client.start_workflow(
            "VideoJobWorkflow", payload, id=job_id, task_queue=jobs.task_queue
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await asyncio.wait_for(handle.result(), 30)
        described = await handle.describe()
    assert described.status == WorkflowExecutionStatus.FAILED
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError) and named in cause.message
    assert "t0ken-42" not in cause.message  # a callback URL may hold a token: never shown
    assert stubs.calls == {}  # nothing measured, nothing submitted, nothing spent


async def test_good_json_from_a_raw_client_runs_like_a_job_from_the_cli(run_jobs: RunJobs):
    job_id = f"raw-{uuid.uuid4().hex[:10]}"
    payload = {"job_id": job_id, "graph": VIDEO_GRAPH, "cloud": {"prompt": "a heron"}}
    async with run_jobs(RouteStubs(FREE)) as jobs:
        handle = await jobs.client.start_workflow(
            "VideoJobWorkflow", payload, id=job_id, task_queue=jobs.task_queue, result_type=Plan
        )
        plan = await handle.result()
    assert (plan.state, plan.route, plan.job_id) == ("completed", "local", job_id)


async def _publications_before_the_probe(handle: WorkflowHandle[Any, Plan]) -> int:
    """The job's own upserts (state, memo) before its first activity: not Temporal's
    TemporalChangeVersion, which every patch upserts."""
    count = 0
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            break
        upserted = event.upsert_workflow_search_attributes_event_attributes.search_attributes
        count += sa.STATE.name in upserted.indexed_fields
        count += event.event_type == EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED
    return count


async def test_a_job_from_spillways_client_starts_with_its_first_publication(run_jobs: RunJobs):
    # The raw job publishes "probing" in its first workflow task; spillway's client starts a
    # job with that memo and search attribute, so the first task upserts nothing.
    job_id = f"raw-{uuid.uuid4().hex[:10]}"
    async with run_jobs(RouteStubs(FREE)) as jobs:
        ours = await jobs.start(prompt=None)
        started = await ours.describe()
        raw = await jobs.client.start_workflow(
            "VideoJobWorkflow",
            {"job_id": job_id, "graph": VIDEO_GRAPH},
            id=job_id,
            task_queue=jobs.task_queue,
            result_type=Plan,
        )
        plans = [await ours.result(), await raw.result()]
        counts = [await _publications_before_the_probe(h) for h in (ours, raw)]
    assert [p.state for p in plans] == ["completed", "completed"]
    assert await started.memo_value("plan", type_hint=Plan) == Plan(job_id=ours.id)
    assert started.typed_search_attributes.get(sa.STATE) == "probing"
    assert counts == [0, 2]
