"""What the Temporal UI shows of the GPU line (docs/design.md, "GPU admission"): the current
details of a queued job ("2nd in line for the GPUs") and of the pool (each host's places, the
head of the line), read as the UI reads them: the `__temporal_workflow_metadata` query through
the server's HTTP API."""

from __future__ import annotations

import httpx

from spillway.core import names
from spillway.sim.comfyui import ComfyUISim
from tests.reliability.harness import DevServer
from tests.support.cli import decoded
from tests.support.graphs import VIDEO_GRAPH


async def current_details(http: httpx.AsyncClient, server: DevServer, workflow_id: str) -> str:
    query = "__temporal_workflow_metadata"
    response = await http.post(
        f"{server.api(ui=False)}/workflows/{workflow_id}/query/{query}",
        json={"query": {"queryType": query}},
        timeout=10,
    )
    assert response.status_code == 200, response.text
    return decoded(response.json())


async def test_the_ui_shows_a_queued_job_s_place_in_line_and_the_pool_s_places(
    workers, jobs_on, temporal_server: DevServer, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.2
    comfyui.pause()  # the holder's prompt stays pending: its place stays held
    worker = await workers(COMFYUI_URL=comfyui.url, A40_MAX_JOBS=1)
    jobs = jobs_on(worker)
    holder = await jobs.submit(None, VIDEO_GRAPH)
    await jobs.until(holder, "running_local")
    first = await jobs.submit(None, VIDEO_GRAPH)
    await jobs.until(first, "queued")
    second = await jobs.submit(None, VIDEO_GRAPH)
    await jobs.until(second, "queued")
    async with httpx.AsyncClient() as http:
        job_details = await current_details(http, temporal_server, second)
        pool_details = await current_details(
            http, temporal_server, names.pool_id(worker.task_queue)
        )
    comfyui.resume()
    plans = [await jobs.finished(job_id) for job_id in (holder, first, second)]

    assert "2nd in line for the GPUs" in job_details, job_details
    assert "GPU places" in pool_details and "1 of 1" in pool_details
    assert holder in pool_details and first in pool_details and second in pool_details
    assert [p.state for p in plans] == ["completed"] * 3
