"""The LOCAL route of VideoJobWorkflow: on the GPU host the measurement chose, submit to ComfyUI,
wait, download, and take the prompt back out of ComfyUI when the job is cancelled
(docs/design.md, "GPU hosts and agents", "ComfyUI facts")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows import calls
from workflows.approvals import LOCAL
from workflows.job_base import JobBase
from workflows.patches import PATCH_PROMPT_PER_RUN

with workflow.unsafe.imports_passed_through():
    from spillway.comfyui_models import (
        ComfyUICancel,
        ComfyUIDownload,
        ComfyUISubmit,
        ComfyUIUpload,
        ComfyUIWait,
        client_id_for,
        prompt_id_for,
    )
    from spillway.host_models import HostRef, Policy
    from spillway.inputs import with_inputs
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


class LocalRoute(JobBase):
    # --- LOCAL ---------------------------------------------------------------------------------

    async def _run_local(self, policy: Policy) -> None:
        self._plan.route = "local"
        host = self._host_named(self._next_host)
        self._plan.host = host.name if host else None
        self._count(LOCAL)
        client_id = client_id_for(self._job.job_id)
        # A reset or re-run gets prompt ids of its own: a long-lived ComfyUI still holds the
        # earlier run's prompt (and its video) under the old one.
        run = workflow.info().run_id if self._patched(PATCH_PROMPT_PER_RUN) else None
        graph = await self._with_uploaded_inputs(host)
        while self._plan.local_attempts < policy.comfyui_max_attempts:
            self._plan.local_attempts += 1
            prompt_id = prompt_id_for(self._job.job_id, self._plan.local_attempts, run)
            self._plan.prompt_id = prompt_id
            self._set_state("running_local")
            submit = ComfyUISubmit(
                job_id=self._job.job_id,
                prompt_id=prompt_id,
                client_id=client_id,
                graph=graph,
                front=self._job.priority == 1,
                own_run=run is not None,
            )
            # Never abandoned: a job cancelled mid-submit waits for it, then takes it back out.
            await to_the_end(calls.comfyui_submit(submit, self._heartbeat, host, self._priority))
            wait = ComfyUIWait(job_id=self._job.job_id, prompt_id=prompt_id, client_id=client_id)
            finished = await calls.comfyui_wait(wait, self._heartbeat, host, self._priority)
            if finished.outcome == "lost":
                # ComfyUI restarted and forgot the prompt: resubmitting locally costs nothing.
                self._plan.reasons = [*self._plan.reasons, f"comfyui_lost_prompt={prompt_id}"]
                continue
            download = ComfyUIDownload(job_id=self._job.job_id, files=finished.files)
            downloaded = await calls.comfyui_download(
                download, self._heartbeat, host, self._priority
            )
            self._plan.outputs = downloaded.outputs
            return
        self._fail(texts.lost_too_often(self._plan.local_attempts))

    async def _with_uploaded_inputs(self, host: HostRef | None) -> dict[str, Any]:
        """The graph with each input image uploaded to the host that renders it, its loader
        pointing at the uploaded file. Nothing to do (and no history event) without inputs."""
        uploaded: dict[str, str] = {}
        for item in self._job.inputs:
            upload = ComfyUIUpload(job_id=self._job.job_id, input=item)
            done = await calls.comfyui_upload(upload, self._heartbeat, host, self._priority)
            uploaded[done.node] = done.name
        return with_inputs(self._job.graph, uploaded) if uploaded else self._job.graph

    def _host_named(self, name: str | None) -> HostRef | None:
        """The host to run on; None for a job from before hosts (its own task queue)."""
        if not self._hosts:
            return None
        return next((h for h in self._hosts if h.name == name), self._hosts[0])

    async def _cancel_local_prompt(self) -> None:
        if self._plan.route != "local" or self._plan.prompt_id is None:
            return
        # A job shows `cancelled` only once ComfyUI no longer holds its prompt.
        cancel = ComfyUICancel(prompt_id=self._plan.prompt_id)
        host = self._host_named(self._plan.host)
        cancelled = await calls.comfyui_cancel(cancel, self._heartbeat, host)
        self._plan.reasons = [*self._plan.reasons, f"comfyui_prompt_{cancelled.was}_cancelled"]
