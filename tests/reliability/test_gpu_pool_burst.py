"""A burst of local-only jobs started at once against two places (docs/design.md, "GPU
admission"): every one reaches the line or a place and completes, ComfyUI never holds more than
two, none POSTs twice, and the pool continues as new on its way (it takes 500 signals a run, far
below Temporal's 10,000), carrying a payload well under Temporal's 512 KB warning.

CI starts 200 (two places pass about 2 jobs a second on its 2 cores, the dev server's SQLite
being the bottleneck), with a pool that continues as new every 100 signals;
`SPILLWAY_BURST_JOBS=1000` runs the thousand, with the pool as the worker starts it (-s prints
the figures)."""

from __future__ import annotations

import os
import time

import pytest
from temporalio.client import Client

from spillway.core import names
from spillway.core.gpu_pool import PoolInput
from spillway.sim.comfyui import ComfyUISim
from tests.reliability.harness import DevServer
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import Jobs, pool_settled, start_all
from tests.support.waiting import until_all

JOBS = int(os.environ.get("SPILLWAY_BURST_JOBS", "200"))

# A backstop only: `until_all` fails when the jobs stop ending; a busy machine may take long.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(600 + 5 * JOBS)]


async def _ended(client: Client, queue: str) -> int:
    return (
        await client.count_workflows(
            f"TaskQueue = '{queue}' AND WorkflowType = '{names.VIDEO_JOB}' "
            "AND ExecutionStatus != 'Running'"
        )
    ).count


async def test_a_burst_of_jobs_at_once_all_complete_through_two_places(
    workers, temporal_server: DevServer, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.0
    worker = await workers(COMFYUI_URL=comfyui.url, A40_MAX_JOBS=2)
    # Not among the session's sightings: the secrets scenario need not read a thousand more.
    client, queue = temporal_server.client, worker.task_queue
    jobs = Jobs(client, queue)
    if JOBS < 1000:
        await client.start_workflow(
            names.GPU_POOL,
            PoolInput(signals_per_run=100),
            id=names.pool_id(queue),
            task_queue=names.pool_queue(queue),
        )
    started = time.monotonic()
    await start_all(lambda: jobs.submit(None, VIDEO_GRAPH) for _ in range(JOBS))
    submitted_s = time.monotonic() - started
    await until_all(lambda: _ended(client, queue), JOBS, what="the jobs' ends")
    total_s = time.monotonic() - started

    completed = await client.count_workflows(
        f"TaskQueue = '{queue}' AND WorkflowType = '{names.VIDEO_JOB}' "
        "AND ExecutionStatus = 'Completed'"
    )
    assert completed.count == JOBS
    assert comfyui.most_held <= 2
    assert len(comfyui.prompt_posts) == JOBS and set(comfyui.prompt_posts.values()) == {1}
    view = await pool_settled(client, queue)
    assert view.line == [] and [p for h in view.hosts for p in h.places] == []

    carried = []
    async for run in client.list_workflows(f"WorkflowId = '{names.pool_id(queue)}'"):
        handle = client.get_workflow_handle(run.id, run_id=run.run_id)
        async for event in handle.fetch_history_events():
            started_event = event.workflow_execution_started_event_attributes
            carried.append(sum(len(p.data) for p in started_event.input.payloads))
            break
    assert len(carried) >= 2, "the pool never continued as new"
    assert max(carried) < 512 * 1024
    print(
        f"\n{JOBS} jobs: submitted in {submitted_s:.1f} s, all ended {total_s:.1f} s after the "
        f"first start; pool runs {len(carried)}, largest carried input {max(carried):,} bytes; "
        f"ComfyUI held at most {comfyui.most_held}"
    )
