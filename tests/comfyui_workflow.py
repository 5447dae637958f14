"""Tiny workflows that run the ComfyUI activities by their registered names, so tests see them
through Temporal: the default retry policy (unlimited attempts, stopped only by non-retryable
errors), heartbeat timeouts and the pydantic converter, as VideoJobWorkflow uses them."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from spillway.comfyui_models import (
        ComfyUIDownload,
        ComfyUIFinished,
        ComfyUISubmit,
        ComfyUISubmitted,
        ComfyUIWait,
    )
    from spillway.models import Downloaded


@workflow.defn
class SubmitOnce:
    @workflow.run
    async def run(self, req: ComfyUISubmit) -> ComfyUISubmitted:
        submitted: ComfyUISubmitted = await workflow.execute_activity(
            "comfyui_submit",
            req,
            result_type=ComfyUISubmitted,
            start_to_close_timeout=timedelta(seconds=30),
        )
        return submitted


@workflow.defn
class RenderLocally:
    """Submit, wait, download: the LOCAL route without the routing around it."""

    @workflow.run
    async def run(self, req: ComfyUISubmit) -> Downloaded:
        await workflow.execute_activity(
            "comfyui_submit",
            req,
            result_type=ComfyUISubmitted,
            start_to_close_timeout=timedelta(seconds=30),
        )
        finished: ComfyUIFinished = await workflow.execute_activity(
            "comfyui_wait",
            ComfyUIWait(job_id=req.job_id, prompt_id=req.prompt_id, client_id=req.client_id),
            result_type=ComfyUIFinished,
            start_to_close_timeout=timedelta(hours=2),
            heartbeat_timeout=timedelta(seconds=30),
        )
        downloaded: Downloaded = await workflow.execute_activity(
            "comfyui_download",
            ComfyUIDownload(job_id=req.job_id, files=finished.files),
            result_type=Downloaded,
            start_to_close_timeout=timedelta(hours=1),
            heartbeat_timeout=timedelta(seconds=30),
        )
        return downloaded
