"""The LOCAL route of VideoJobWorkflow: on the GPU host the measurement chose, upload the job's
input images, submit to ComfyUI, wait, download, and take the prompt back out of ComfyUI when
the job is cancelled (docs/design.md, "GPU hosts and agents", "ComfyUI facts"). Workflow code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows import activity_calls as calls
from workflows.job_state import LOCAL, VideoJobState

with workflow.unsafe.imports_passed_through():
    from activities.comfyui.models import (
        ComfyUICancel,
        ComfyUIDownload,
        ComfyUISubmit,
        ComfyUIUpload,
        ComfyUIWait,
        prompt_id_for,
    )
    from spillway.images import with_inputs
    from spillway.models import HostRef
    from workflows import texts

_T = TypeVar("_T")


async def to_the_end(work: Awaitable[_T]) -> _T:
    """Awaits `work` even when the job is cancelled meanwhile, then lets the cancel through: what
    was sent (a prompt, a paid create) is known before the job cleans up after it."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(ActivityError):
            await task
        raise


async def run(s: VideoJobState) -> None:
    plan, job = s.plan, s.job
    plan.route = "local"
    host = s.host_named(s.next_host)
    plan.host = host.name
    s.count(LOCAL)
    # A reset or re-run gets prompt ids of its own: a long-lived ComfyUI still holds the earlier
    # run's prompt (and its video) under the old one.
    run_id = workflow.info().run_id
    graph = await _with_uploaded_inputs(s, host)
    while plan.local_attempts < s.policy.comfyui_max_attempts:
        plan.local_attempts += 1
        prompt_id = prompt_id_for(job.job_id, plan.local_attempts, run_id)
        plan.prompt_id = prompt_id
        s.set_state("running_local")
        submit = ComfyUISubmit(
            job_id=job.job_id, prompt_id=prompt_id, graph=graph, front=job.priority == 1
        )
        # Never abandoned: a job cancelled mid-submit waits for it, then takes it back out.
        await to_the_end(calls.comfyui_submit(submit, s.heartbeat, host, s.priority))
        wait = ComfyUIWait(job_id=job.job_id, prompt_id=prompt_id)
        finished = await calls.comfyui_wait(wait, s.heartbeat, host, s.priority)
        if finished.outcome == "lost":
            # ComfyUI restarted and forgot the prompt: resubmitting locally costs nothing.
            s.reason(f"comfyui_lost_prompt={prompt_id}")
            continue
        download = ComfyUIDownload(job_id=job.job_id, files=finished.files)
        plan.outputs = (
            await calls.comfyui_download(download, s.heartbeat, host, s.priority)
        ).outputs
        return
    s.fail(texts.lost_too_often(plan.local_attempts))


async def _with_uploaded_inputs(s: VideoJobState, host: HostRef) -> dict[str, Any]:
    """The graph with each input image uploaded to the host that renders it, its loader
    pointing at the uploaded file. Nothing to do (and no history event) without inputs."""
    uploaded: dict[str, str] = {}
    for item in s.job.inputs:
        upload = ComfyUIUpload(job_id=s.job.job_id, input=item)
        done = await calls.comfyui_upload(upload, s.heartbeat, host, s.priority)
        uploaded[done.node] = done.name
    return with_inputs(s.job.graph, uploaded) if uploaded else s.job.graph


async def cancel_prompt(s: VideoJobState) -> None:
    """A job shows `cancelled` only once ComfyUI no longer holds its prompt."""
    if s.plan.route != "local" or s.plan.prompt_id is None:
        return
    cancel = ComfyUICancel(prompt_id=s.plan.prompt_id)
    cancelled = await calls.comfyui_cancel(cancel, s.heartbeat, s.host_named(s.plan.host))
    s.reason(f"comfyui_prompt_{cancelled.was}_cancelled")
