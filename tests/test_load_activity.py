"""`a40_load_status` as a Temporal activity: registered by the worker under its name, its result
a LoadStatus that survives the pydantic converter and stays in the workflow's history."""

from __future__ import annotations

import uuid

from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.probe.activities import LoadProbeRequest, LoadStatusActivities
from spillway.core.models import LoadStatus
from tests.support.constants import FREE_VRAM_PCT
from tests.support.workflows import ProbeOnce


async def test_measurement_travels_through_temporal_and_stays_in_history(
    env: WorkflowEnvironment, http, comfyui_settings, gpu
):
    task_queue = f"probe-{uuid.uuid4()}"
    settings = comfyui_settings(A40_VRAM_BUSY_PCT=1)
    async with Worker(
        env.client,
        task_queue=task_queue,
        workflows=[ProbeOnce],
        activities=[LoadStatusActivities(http, settings, gpu).a40_load_status],
    ):
        handle = await env.client.start_workflow(
            ProbeOnce.run,
            LoadProbeRequest(job_id="job-1"),
            id=f"probe-{uuid.uuid4()}",
            task_queue=task_queue,
        )
        status = await handle.result()

    assert isinstance(status, LoadStatus)
    assert status.overloaded and status.reasons == [f"vram_used_{FREE_VRAM_PCT}pct_ge_1.0pct"]
    assert status.measured_at.tzinfo is not None
    history = await handle.fetch_history()
    recorded = [
        LoadStatus.model_validate_json(
            event.activity_task_completed_event_attributes.result.payloads[0].data
        )
        for event in history.events
        if event.HasField("activity_task_completed_event_attributes")
    ]
    assert recorded == [status]
