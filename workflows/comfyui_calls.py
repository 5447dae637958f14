"""The ComfyUI activities VideoJobWorkflow's LOCAL route runs, called typed, on the job's GPU
host (its own task queue; long waits and downloads on the host's waits queue) with the timeouts
and retry policies that let an agent die without losing or doubling a render. Re-exported by
workflows/calls.py, where the workflows find every activity call.

Workflow code only: these calls must be awaited inside a workflow.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Generic, TypeVar

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy

from workflows.call_options import FREE_RETRY, heartbeating

with workflow.unsafe.imports_passed_through():
    from activities.comfyui import ComfyUIActivities
    from spillway import comfyui_models as comfyui
    from spillway.host_models import HostRef
    from spillway.models import Downloaded

_Req = TypeVar("_Req")
_Result = TypeVar("_Result")


@dataclass(frozen=True)
class HostCall(Generic[_Req, _Result]):
    """One ComfyUI activity, run on the job's host (without one: the job's own queue)."""

    method: Callable[[ComfyUIActivities, _Req], Awaitable[_Result]]
    start_to_close: timedelta
    retry: RetryPolicy
    waits: bool = False  # on the host's waits queue and slot pool

    async def __call__(
        self,
        req: _Req,
        heartbeat: timedelta,
        host: HostRef | None,
        priority: Priority = Priority.default,
    ) -> _Result:
        """`priority`: the job's own (Priority.default: the workflow's, which its client may
        have set)."""
        queue = None if host is None else host.waits_queue if self.waits else host.task_queue
        options = heartbeating(
            queue, priority, heartbeat, start_to_close=self.start_to_close, retry=self.retry
        )
        return await workflow.execute_activity_method(self.method, req, **options)


def _retried_but(*final: str) -> RetryPolicy:
    return RetryPolicy(maximum_interval=timedelta(seconds=30), non_retryable_error_types=[*final])


# Safe to retry: the content names the file, so a second upload writes the same file.
comfyui_upload: HostCall[comfyui.ComfyUIUpload, comfyui.ComfyUIUploaded] = HostCall(
    ComfyUIActivities.upload,
    timedelta(minutes=10),
    _retried_but(comfyui.UPLOAD_REFUSED, comfyui.INPUT_UNREADABLE),
)
# Longer than one attempt can take (its requests and their timeouts), so two attempts never
# overlap; a dead agent is noticed by its heartbeat instead. A retried submit looks for its
# prompt_id in ComfyUI before posting, so it never posts twice.
comfyui_submit: HostCall[comfyui.ComfyUISubmit, comfyui.ComfyUISubmitted] = HostCall(
    ComfyUIActivities.submit, timedelta(minutes=5), _retried_but(comfyui.GRAPH_REJECTED)
)
# Its own queue and slot pool: thousands of waits never starve a probe or a create.
comfyui_wait: HostCall[comfyui.ComfyUIWait, comfyui.ComfyUIFinished] = HostCall(
    ComfyUIActivities.wait,
    timedelta(hours=24),
    _retried_but(comfyui.EXECUTION_FAILED, comfyui.INTERRUPTED),
    waits=True,
)
comfyui_download: HostCall[comfyui.ComfyUIDownload, Downloaded] = HostCall(
    ComfyUIActivities.download, timedelta(hours=6), FREE_RETRY, waits=True
)
comfyui_cancel: HostCall[comfyui.ComfyUICancel, comfyui.ComfyUICancelled] = HostCall(
    ComfyUIActivities.cancel, timedelta(minutes=10), FREE_RETRY
)
