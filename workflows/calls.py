"""Every activity VideoJobWorkflow runs, called typed (`execute_activity_method` on the activity
classes, so mypy checks inputs and results) with the timeouts and retry policies that make the
money invariants hold. Test workflows call the same functions, so what they prove is what runs.

Workflow code only: these functions must be awaited inside a workflow.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.workflow import ActivityHandle

with workflow.unsafe.imports_passed_through():
    from activities import kling as kling_errors
    from activities import minimax as minimax_errors
    from activities.comfyui import ComfyUIActivities
    from activities.kling import KlingActivities
    from activities.load_status import LoadStatusActivities
    from activities.minimax import MiniMaxActivities
    from activities.notify import NotifyActivities
    from activities.policy import PolicyActivities
    from activities.spend import SpendActivities
    from spillway import comfyui_models as comfyui
    from spillway.cloud_models import (
        CloudCreate,
        CloudCreated,
        CloudDone,
        CloudDownload,
        CloudPoll,
        SpendRequest,
    )
    from spillway.comfyui_models import (
        ComfyUICancel,
        ComfyUICancelled,
        ComfyUIDownload,
        ComfyUIFinished,
        ComfyUISubmit,
        ComfyUISubmitted,
        ComfyUIUpload,
        ComfyUIUploaded,
        ComfyUIWait,
    )
    from spillway.host_models import HostRef, LoadProbeRequest, LoadStatus, Policy, PolicyRequest
    from spillway.hosts import WAITS_SUFFIX
    from spillway.models import ApprovalNotice, Downloaded
    from spillway.spend_models import (
        BudgetView,
        Reservation,
        SpendEntry,
        SpendSettle,
    )

# Reads that cost nothing may retry for as long as it takes; a stuck one is visible in the UI.
FREE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
)
# A create is never run twice by Temporal (money invariant 2); the ledger guards the rest.
NEVER_RETRY = RetryPolicy(maximum_attempts=1)
CREATE_TIMEOUT = timedelta(minutes=10)
# How long a probe may wait for a host's agent to pick it up: a host whose agent is down is
# "unreachable" for that probe after this, never a hang.
PROBE_BOUND = timedelta(seconds=10)


async def read_policy(job_id: str) -> Policy:
    return await workflow.execute_activity_method(
        PolicyActivities.read_policy,
        PolicyRequest(job_id=job_id),
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=FREE_RETRY,
    )


async def probe(
    job_id: str, host: HostRef | None, priority: Priority = Priority.default
) -> LoadStatus:
    """On a host's agent, bounded (docs/design.md, "GPU hosts and agents"): an agent that does
    not pick the probe up within PROBE_BOUND (down, or gone mid-probe and not back) fails it,
    and the caller reads that as "no answer" (fail-open: unreachable needs two). A probe that
    raises is retried, as it always was. Without a host (a job from before hosts existed): on
    the job's own task queue."""
    if host is None:
        return await workflow.execute_activity_method(
            LoadStatusActivities.a40_load_status,
            LoadProbeRequest(job_id=job_id),
            start_to_close_timeout=timedelta(seconds=90),
            retry_policy=FREE_RETRY,
        )
    return await workflow.execute_activity_method(
        LoadStatusActivities.a40_load_status,
        LoadProbeRequest(job_id=job_id),
        task_queue=host.task_queue,
        priority=priority,
        schedule_to_start_timeout=PROBE_BOUND,  # never retried: the agent is not there
        start_to_close_timeout=timedelta(seconds=60),
        retry_policy=FREE_RETRY,
    )


async def notify(notice: ApprovalNotice) -> None:
    await workflow.execute_activity_method(
        NotifyActivities.notify_approval_needed,
        notice,
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_attempts=5, initial_interval=timedelta(seconds=2)),
    )


# --- LOCAL ---------------------------------------------------------------------------------
# `priority`: the job's own (Priority.default: the workflow's, which its client may have set).


async def comfyui_upload(
    req: ComfyUIUpload, heartbeat: timedelta, host: HostRef | None, priority: Priority
) -> ComfyUIUploaded:
    return await workflow.execute_activity_method(
        ComfyUIActivities.upload,
        req,
        task_queue=host.task_queue if host else None,
        priority=priority,
        # Safe to retry: the content names the file, so a second upload writes the same file.
        start_to_close_timeout=timedelta(minutes=10),
        heartbeat_timeout=heartbeat,
        retry_policy=RetryPolicy(
            maximum_interval=timedelta(seconds=30),
            non_retryable_error_types=[comfyui.UPLOAD_REFUSED, comfyui.INPUT_UNREADABLE],
        ),
    )


async def comfyui_submit(
    req: ComfyUISubmit,
    heartbeat: timedelta,
    host: HostRef | None,
    priority: Priority = Priority.default,
) -> ComfyUISubmitted:
    return await workflow.execute_activity_method(
        ComfyUIActivities.submit,
        req,
        task_queue=host.task_queue if host else None,
        priority=priority,
        # Longer than one attempt can take (its requests and their timeouts), so two attempts
        # never overlap; a dead agent is noticed by its heartbeat instead. A retried submit
        # looks for its prompt_id in ComfyUI before posting, so it never posts twice.
        start_to_close_timeout=timedelta(minutes=5),
        heartbeat_timeout=heartbeat,
        retry_policy=RetryPolicy(
            maximum_interval=timedelta(seconds=30),
            non_retryable_error_types=[comfyui.GRAPH_REJECTED],
        ),
    )


async def comfyui_wait(
    req: ComfyUIWait,
    heartbeat: timedelta,
    host: HostRef | None,
    priority: Priority = Priority.default,
) -> ComfyUIFinished:
    return await workflow.execute_activity_method(
        ComfyUIActivities.wait,
        req,
        # Its own queue and slot pool: thousands of waits never starve a probe or a create.
        task_queue=host.waits_queue if host else None,
        priority=priority,
        start_to_close_timeout=timedelta(hours=24),
        heartbeat_timeout=heartbeat,
        retry_policy=RetryPolicy(
            maximum_interval=timedelta(seconds=30),
            non_retryable_error_types=[comfyui.EXECUTION_FAILED, comfyui.INTERRUPTED],
        ),
    )


async def comfyui_download(
    req: ComfyUIDownload,
    heartbeat: timedelta,
    host: HostRef | None,
    priority: Priority = Priority.default,
) -> Downloaded:
    return await workflow.execute_activity_method(
        ComfyUIActivities.download,
        req,
        task_queue=host.waits_queue if host else None,
        priority=priority,
        start_to_close_timeout=timedelta(hours=6),
        heartbeat_timeout=heartbeat,
        retry_policy=FREE_RETRY,
    )


async def comfyui_cancel(
    req: ComfyUICancel, heartbeat: timedelta, host: HostRef | None
) -> ComfyUICancelled:
    return await workflow.execute_activity_method(
        ComfyUIActivities.cancel,
        req,
        task_queue=host.task_queue if host else None,
        start_to_close_timeout=timedelta(minutes=10),
        heartbeat_timeout=heartbeat,
        retry_policy=FREE_RETRY,
    )


# --- CLOUD ---------------------------------------------------------------------------------


async def spend_reserve(req: SpendRequest) -> Reservation:
    # Money fails closed: a ledger that does not answer within this leaves the job failed with
    # nothing sent, instead of a create on a guess.
    return await workflow.execute_activity_method(
        SpendActivities.reserve,
        req,
        start_to_close_timeout=timedelta(minutes=1),
        schedule_to_close_timeout=timedelta(minutes=10),
        retry_policy=FREE_RETRY,
    )


async def spend_settle(req: SpendSettle) -> SpendEntry | None:
    return await workflow.execute_activity_method(
        SpendActivities.settle,
        req,
        start_to_close_timeout=timedelta(minutes=1),
        retry_policy=FREE_RETRY,
    )


async def spend_recorded(req: SpendRequest) -> SpendEntry | None:
    # Asked before a person is: a ledger that cannot answer leaves the question to the person
    # (the reservation still refuses a second create).
    return await workflow.execute_activity_method(
        SpendActivities.recorded,
        req,
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_attempts=2),
    )


async def spend_view(req: SpendRequest) -> BudgetView:
    # Only shown to people: a ledger that cannot answer quickly is no reason to wait.
    return await workflow.execute_activity_method(
        SpendActivities.view,
        req,
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_attempts=2),
    )


def cloud_create(
    req: CloudCreate, heartbeat: timedelta, priority: Priority = Priority.default
) -> ActivityHandle[CloudCreated]:
    """Started, not awaited: the caller shields it, because a create once sent is never
    abandoned (a cancelled job still records the task it ordered). Never retried by Temporal
    (money invariant 2): a provider that can be asked whether its task exists (Kling, by its
    external task id) does so inside the activity."""
    method = KlingActivities.create if req.provider == "kling" else MiniMaxActivities.create
    return workflow.start_activity_method(
        method,
        req,
        priority=priority,
        start_to_close_timeout=CREATE_TIMEOUT,
        heartbeat_timeout=heartbeat,
        retry_policy=NEVER_RETRY,
    )


def waits_queue() -> str:
    """Long cloud activities (poll, download) have a queue and a slot pool of their own."""
    return workflow.info().task_queue + WAITS_SUFFIX


async def cloud_poll(
    req: CloudPoll, heartbeat: timedelta, priority: Priority = Priority.default
) -> CloudDone:
    if req.provider == "kling":
        return await workflow.execute_activity_method(
            KlingActivities.poll,
            req,
            **_waiting(heartbeat, priority, [kling_errors.TASK_FAILED, kling_errors.REFUSED]),
        )
    return await workflow.execute_activity_method(
        MiniMaxActivities.poll,
        req,
        **_waiting(heartbeat, priority, [minimax_errors.TASK_FAILED, minimax_errors.PERMANENT]),
    )


async def cloud_download(
    req: CloudDownload, heartbeat: timedelta, priority: Priority = Priority.default
) -> Downloaded:
    if req.provider == "kling":
        return await workflow.execute_activity_method(
            KlingActivities.download,
            req,
            **_waiting(heartbeat, priority, [kling_errors.VIDEO_GONE]),
        )
    return await workflow.execute_activity_method(
        MiniMaxActivities.download,
        req,
        **_waiting(heartbeat, priority, [minimax_errors.PERMANENT]),
    )


def _waiting(heartbeat: timedelta, priority: Priority, final: list[str]) -> Any:
    """Options of the long cloud activities: free to retry, on their own queue, bounded."""
    return {
        "task_queue": waits_queue(),
        "priority": priority,
        "start_to_close_timeout": timedelta(hours=24),
        "heartbeat_timeout": heartbeat,
        "retry_policy": RetryPolicy(
            maximum_interval=timedelta(seconds=60), non_retryable_error_types=final
        ),
    }
