"""`a40_load_status` as a Temporal activity: registered by the worker under its name, its result
a LoadStatus that survives the pydantic converter and stays in the workflow's history."""

from __future__ import annotations

import logging
import uuid

from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
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


async def test_the_pool_s_probes_log_a_line_only_when_the_reading_changes(
    http, comfyui_settings, gpu, comfyui, caplog
):
    """While a job waits for headroom the GPU pool probes every 2 s: one INFO line per change
    of the reading, not one per probe (issue 61, item 7)."""
    probes = LoadStatusActivities(http, comfyui_settings(), gpu)
    env = ActivityEnvironment()
    caplog.set_level(logging.INFO, logger="temporalio.activity")

    def said() -> list[str]:
        return [
            r.getMessage().split(" ({")[0]
            for r in caplog.records
            if r.levelno == logging.INFO and r.getMessage().startswith("load probe for gpu-pool")
        ]

    comfyui.set_vram_used_pct(97)
    for _ in range(5):
        await env.run(probes.a40_load_status, LoadProbeRequest(job_id="gpu-pool"))
    assert len(said()) == 1 and "overloaded=True" in said()[0]
    comfyui.set_vram_used_pct(10)
    for _ in range(3):
        await env.run(probes.a40_load_status, LoadProbeRequest(job_id="gpu-pool"))
    assert len(said()) == 2 and "overloaded=False" in said()[1]
    # A job's own probe is its own line, whatever the pool's last was.
    await env.run(probes.a40_load_status, LoadProbeRequest(job_id="job-1"))
    assert len([r for r in caplog.records if "load probe for job-1" in r.getMessage()]) == 1
