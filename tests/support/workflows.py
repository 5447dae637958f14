"""Tiny workflows that run one route's activities through Temporal (the pydantic converter,
retry policies, heartbeat timeouts, the history) without the routing around them. They call the
typed functions of workflows/activity_calls.py, as VideoJobWorkflow does, so what they prove is what
runs; where one uses other options on purpose, it says why."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow

from workflows import activity_calls as calls

with workflow.unsafe.imports_passed_through():
    from activities.cloud.models import CloudCreate, CloudCreated, CloudDownload, CloudPoll
    from activities.comfyui.models import (
        ComfyUIDownload,
        ComfyUISubmit,
        ComfyUISubmitted,
        ComfyUIWait,
    )
    from activities.minimax.activities import PROVIDER as MINIMAX
    from activities.probe.activities import LoadProbeRequest
    from spillway.core import names
    from spillway.core.models import Downloaded, HostRef, LoadStatus

HEARTBEAT = timedelta(seconds=30)  # SPILLWAY_HEARTBEAT_TIMEOUT_S's largest value


def here() -> HostRef:
    """A GPU host whose agent serves the test workflow's own task queue."""
    queue = workflow.info().task_queue
    return HostRef(name="here", task_queue=queue, waits_queue=queue)


@workflow.defn
class ProbeOnce:
    """One measurement, kept in the history as VideoJobWorkflow keeps it."""

    @workflow.run
    async def run(self, req: LoadProbeRequest) -> LoadStatus:
        return await calls.probe(req.job_id or "-", here())  # "-": unlabelled, as logged


# --- LOCAL ---------------------------------------------------------------------------------


@workflow.defn
class SubmitOnce:
    @workflow.run
    async def run(self, req: ComfyUISubmit) -> ComfyUISubmitted:
        return await calls.comfyui_submit(req, HEARTBEAT, here())


@workflow.defn
class RenderLocally:
    """Submit, wait, download: the LOCAL route without the routing around it."""

    @workflow.run
    async def run(self, req: ComfyUISubmit) -> Downloaded:
        await calls.comfyui_submit(req, HEARTBEAT, here())
        wait = ComfyUIWait(job_id=req.job_id, prompt_id=req.prompt_id)
        finished = await calls.comfyui_wait(wait, HEARTBEAT, here())
        download = ComfyUIDownload(job_id=req.job_id, files=finished.files)
        return await calls.comfyui_download(download, HEARTBEAT, here())


# --- CLOUD ---------------------------------------------------------------------------------


class CreateOnceInput(BaseModel):
    create: CloudCreate
    # False: the create as the real workflow runs it (never retried by Temporal). True:
    # Temporal's default policy (unlimited attempts), to show the error itself forbids a
    # second create.
    default_retry_policy: bool = False


@workflow.defn(name=names.VIDEO_JOB)  # the one workflow whose creates may spend
class CreateOnce:
    @workflow.run
    async def run(self, inp: CreateOnceInput) -> CloudCreated:
        if not inp.default_retry_policy:
            return await calls.cloud_create(MINIMAX, inp.create, HEARTBEAT)
        return await workflow.execute_activity_method(
            MINIMAX.activities.create,
            inp.create,
            start_to_close_timeout=calls.CREATE_TIMEOUT,
            heartbeat_timeout=HEARTBEAT,
        )


@workflow.defn(name=names.VIDEO_JOB)
class CloudOnce:
    """Create, poll, download on MiniMax: the CLOUD route without the routing (and the
    ledger's reservation) around it. Named as spillway's job, whose creates alone may spend
    (the in-process ledger of these tests does not ask Temporal which queue it runs on)."""

    @workflow.run
    async def run(self, req: CloudCreate) -> Downloaded:
        created = await calls.cloud_create(MINIMAX, req, HEARTBEAT)
        poll = CloudPoll(job_id=req.job_id, task_id=created.task_id)
        done = await calls.cloud_poll(MINIMAX, poll, HEARTBEAT)
        download = CloudDownload(
            job_id=req.job_id,
            task_id=done.task_id,
            file_id=done.file_id,
            video_url=done.video_url,
        )
        return await calls.cloud_download(MINIMAX, download, HEARTBEAT)
