"""The worker that runs the GPU pool SIGKILLed while two jobs hold both places and four wait in
line, then started again (docs/design.md, "GPU admission"): every job completes locally,
ComfyUI never held more than two of them and saw one POST each, every job was admitted once,
and the pool ends with no place held and nobody in line."""

from __future__ import annotations

import asyncio
import json

from spillway.client.queue import pool_view
from spillway.core import names
from spillway.sim.comfyui import ComfyUISim
from tests.reliability.harness import posts_of
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import pool_settled
from tests.support.waiting import until


async def test_the_pool_s_worker_killed_with_places_held_and_a_line_loses_nothing(
    workers, jobs_on, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.5
    comfyui.pause()  # the admitted prompts stay pending: both places stay held until resumed
    worker = await workers(COMFYUI_URL=comfyui.url, A40_MAX_JOBS=2)
    jobs = jobs_on(worker)
    most = 0

    async def sample() -> None:
        nonlocal most
        while True:
            most = max(most, len(comfyui.queue_running) + len(comfyui.queue_pending))
            await asyncio.sleep(0.01)

    sampler = asyncio.create_task(sample())
    ids = [await jobs.submit(None, VIDEO_GRAPH) for _ in range(6)]
    client = jobs.client

    async def line() -> list[str]:
        return [i.job_id for i in (await pool_view(client, worker.task_queue)).line]

    await until(line, lambda waiting: len(waiting) == 4, timeout_s=60, what="four in line")
    await worker.kill()
    await worker.start()
    comfyui.resume()
    plans = [await jobs.finished(job_id, timeout_s=60) for job_id in ids]
    sampler.cancel()

    assert [(p.state, p.route, p.local_attempts) for p in plans] == [("completed", "local", 1)] * 6
    assert most <= 2
    assert posts_of(comfyui, ids) == dict.fromkeys(ids, 1)
    for job_id in ids:
        admissions = 0
        async for event in client.get_workflow_handle(job_id).fetch_history_events():
            signal = event.workflow_execution_signaled_event_attributes
            if signal.signal_name == names.POOL_ANSWER:
                answer = json.loads(signal.input.payloads[0].data)
                admissions += answer.get("host") is not None
        assert admissions == 1, job_id
    view = await pool_settled(client, worker.task_queue)
    assert view.line == [] and [p for h in view.hosts for p in h.places] == []
