"""The one worker (the pool, the jobs and the host's agent) SIGKILLed mid-preemption, while the
victim waits for ComfyUI to stop its render at the next node boundary, then started again
(docs/design.md, "Preemption"): the place goes to the urgent job once the victim's prompt is
out, the victim renders again after it with a second prompt, and ComfyUI never held more prompts
than the one place."""

from __future__ import annotations

import asyncio
import uuid

from spillway.client import jobs as job_ops
from spillway.client.queue import pool_view
from spillway.core.models import VideoJob
from spillway.sim.comfyui import ComfyUISim
from tests.support.gpu_line import Sampler
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import pool_settled
from tests.support.waiting import until


async def test_the_worker_killed_mid_preemption_gives_the_place_to_exactly_one_job(
    workers, jobs_on, comfyui: ComfyUISim
):
    comfyui.execution_s = 30.0  # three nodes of 10 s: the interrupt acts up to 10 s later
    worker = await workers(COMFYUI_URL=comfyui.url, A40_MAX_JOBS=1, SPILLWAY_PREEMPT="priority")
    jobs = jobs_on(worker)
    client, queue = jobs.client, worker.task_queue

    async def start(priority: int) -> str:
        job = VideoJob(job_id=f"pre-{uuid.uuid4().hex[:10]}", graph=VIDEO_GRAPH, priority=priority)
        await job_ops.submit(client, job, queue)
        assert jobs.started is not None
        jobs.started.append(job.job_id)
        return job.job_id

    sampler = Sampler(comfyui)  # the most prompts ComfyUI held at once, read every 10 ms
    sampling = asyncio.create_task(sampler.run())
    batch = await start(5)
    await until(
        lambda: len(comfyui.queue_running), lambda n: n == 1, timeout_s=60, what="batch rendering"
    )
    first = comfyui.queue_running[0][1]
    urgent = await start(1)

    async def told() -> bool:
        view = await pool_view(client, queue)
        return any(p.preempted_by == urgent for h in view.hosts for p in h.places)

    await until(told, timeout_s=60, what="the batch job told to let go")
    await worker.kill()
    comfyui.execution_s = 0.5
    await worker.start()
    urgent_plan = await jobs.finished(urgent, timeout_s=120)
    batch_plan = await jobs.finished(batch, timeout_s=120)
    sampling.cancel()

    assert (urgent_plan.state, batch_plan.state) == ("completed", "completed")
    assert batch_plan.preempted is not None and batch_plan.preempted.by == urgent
    assert batch_plan.local_attempts == 2 and batch_plan.prompt_id != first
    assert comfyui.prompt_posts[first] == 1
    assert comfyui.prompt_posts[str(batch_plan.prompt_id)] == 1
    assert comfyui.prompt_posts[str(urgent_plan.prompt_id)] == 1
    # The urgent job's render came before the batch job's second one.
    assert (
        comfyui.history[str(urgent_plan.prompt_id)]["prompt"][0]
        < (comfyui.history[str(batch_plan.prompt_id)]["prompt"][0])
    )
    assert sampler.most <= 1 and comfyui.most_held == 1
    view = await pool_settled(client, queue)
    assert view.line == [] and [p for h in view.hosts for p in h.places] == []
