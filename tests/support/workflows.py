"""Tiny workflows that run one route's activities through Temporal (the pydantic converter,
retry policies, heartbeat timeouts, the history) without the routing around them. They call the
typed functions of workflows/calls.py, as VideoJobWorkflow does, so what they prove is what
runs; where one uses other options on purpose, it says why."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel
from temporalio import workflow

from workflows import calls

with workflow.unsafe.imports_passed_through():
    from activities.minimax import MiniMaxActivities
    from spillway.cloud_models import (
        CloudCreate,
        CloudCreated,
        CloudDownload,
        CloudPoll,
    )
    from spillway.comfyui_models import (
        ComfyUIDownload,
        ComfyUISubmit,
        ComfyUISubmitted,
        ComfyUIWait,
    )
    from spillway.host_models import LoadProbeRequest, LoadStatus
    from spillway.models import Downloaded

HEARTBEAT = timedelta(seconds=30)  # SPILLWAY_HEARTBEAT_TIMEOUT_S's largest value


@workflow.defn
class ProbeOnce:
    """One measurement, kept in the history as VideoJobWorkflow keeps it."""

    @workflow.run
    async def run(self, req: LoadProbeRequest) -> LoadStatus:
        return await calls.probe(
            req.job_id or "-", None
        )  # "-": unlabelled, as the activity logs it


# --- LOCAL ---------------------------------------------------------------------------------


@workflow.defn
class SubmitOnce:
    @workflow.run
    async def run(self, req: ComfyUISubmit) -> ComfyUISubmitted:
        return await calls.comfyui_submit(req, HEARTBEAT, None)


@workflow.defn
class RenderLocally:
    """Submit, wait, download: the LOCAL route without the routing around it."""

    @workflow.run
    async def run(self, req: ComfyUISubmit) -> Downloaded:
        await calls.comfyui_submit(req, HEARTBEAT, None)
        wait = ComfyUIWait(job_id=req.job_id, prompt_id=req.prompt_id, client_id=req.client_id)
        finished = await calls.comfyui_wait(wait, HEARTBEAT, None)
        download = ComfyUIDownload(job_id=req.job_id, files=finished.files)
        return await calls.comfyui_download(download, HEARTBEAT, None)


# --- CLOUD ---------------------------------------------------------------------------------


class CreateOnceInput(BaseModel):
    create: CloudCreate
    # False: the create as the real workflow runs it (never retried by Temporal). True:
    # Temporal's default policy (unlimited attempts), to show the error itself forbids a
    # second create.
    default_retry_policy: bool = False


@workflow.defn
class CreateOnce:
    @workflow.run
    async def run(self, inp: CreateOnceInput) -> CloudCreated:
        if not inp.default_retry_policy:
            return await calls.cloud_create(inp.create, HEARTBEAT)
        return await workflow.execute_activity_method(
            MiniMaxActivities.create,
            inp.create,
            start_to_close_timeout=calls.CREATE_TIMEOUT,
            heartbeat_timeout=HEARTBEAT,
        )


@workflow.defn
class CloudOnce:
    """Create, poll, download: the CLOUD route without the routing (and the ledger's
    reservation) around it."""

    @workflow.run
    async def run(self, req: CloudCreate) -> Downloaded:
        created = await calls.cloud_create(req, HEARTBEAT)
        poll = CloudPoll(job_id=req.job_id, task_id=created.task_id, provider=req.provider)
        done = await calls.cloud_poll(poll, HEARTBEAT)
        download = CloudDownload(
            job_id=req.job_id,
            task_id=done.task_id,
            file_id=done.file_id,
            video_url=done.video_url,
            provider=req.provider,
        )
        return await calls.cloud_download(download, HEARTBEAT)
