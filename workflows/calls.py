"""Every activity VideoJobWorkflow runs, called typed (`execute_activity_method` on the activity
classes, so mypy checks inputs and results) with the timeouts and retry policies that make the
money invariants hold. Test workflows call the same functions, so what they prove is what runs.
The ComfyUI calls live in workflows/comfyui_calls.py and are re-exported here.

Workflow code only: these functions must be awaited inside a workflow.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.workflow import ActivityHandle

from workflows.call_options import FREE_RETRY, heartbeating
from workflows.comfyui_calls import comfyui_cancel as comfyui_cancel
from workflows.comfyui_calls import comfyui_download as comfyui_download
from workflows.comfyui_calls import comfyui_submit as comfyui_submit
from workflows.comfyui_calls import comfyui_upload as comfyui_upload
from workflows.comfyui_calls import comfyui_wait as comfyui_wait

with workflow.unsafe.imports_passed_through():
    from activities import kling as kling_errors
    from activities import minimax as minimax_errors
    from activities.kling import KlingActivities
    from activities.load_status import LoadStatusActivities
    from activities.minimax import MiniMaxActivities
    from activities.notify import NotifyActivities
    from activities.policy import PolicyActivities
    from activities.spend import SpendActivities
    from spillway.cloud_models import (
        CloudCreate,
        CloudCreated,
        CloudDone,
        CloudDownload,
        CloudPoll,
        LostCreate,
        Reconciled,
        SpendRequest,
    )
    from spillway.host_models import HostRef, LoadProbeRequest, LoadStatus, Policy, PolicyRequest
    from spillway.hosts import WAITS_SUFFIX
    from spillway.models import ApprovalNotice, Downloaded
    from spillway.spend_models import BudgetView, Reservation, SpendEntry, SpendSettle

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


async def read_policy_here(job_id: str) -> Policy:
    """`read_policy` as a local activity: the worker running the job's workflow task reads its
    own policy (it serves `read_policy` too), recorded as a marker with the same result; one
    activity task and one workflow task less per job, ~0.2 s of a decision under load."""
    return await workflow.execute_local_activity_method(
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
    kling = req.provider == "kling"
    method = KlingActivities.poll if kling else MiniMaxActivities.poll
    final = (
        [kling_errors.TASK_FAILED, kling_errors.REFUSED]
        if kling
        else [minimax_errors.TASK_FAILED, minimax_errors.PERMANENT]
    )
    return await workflow.execute_activity_method(
        method, req, **_waiting(heartbeat, priority, final)
    )


async def cloud_download(
    req: CloudDownload, heartbeat: timedelta, priority: Priority = Priority.default
) -> Downloaded:
    kling = req.provider == "kling"
    method = KlingActivities.download if kling else MiniMaxActivities.download
    final = [kling_errors.VIDEO_GONE] if kling else [minimax_errors.PERMANENT]
    return await workflow.execute_activity_method(
        method, req, **_waiting(heartbeat, priority, final)
    )


async def kling_reconcile(
    req: LostCreate, heartbeat: timedelta, priority: Priority = Priority.default
) -> Reconciled:
    """Free, and bounded: a Kling that will not answer within this leaves the job failed as
    before, saying a charge may exist (the ledger keeps it as maybe_charged)."""
    return await workflow.execute_activity_method(
        KlingActivities.reconcile,
        req,
        schedule_to_close_timeout=timedelta(minutes=30),
        **heartbeating(
            waits_queue(),
            priority,
            heartbeat,
            start_to_close=timedelta(minutes=15),  # a create's longest run, and then some
            retry=RetryPolicy(
                maximum_interval=timedelta(seconds=60),
                non_retryable_error_types=[kling_errors.REFUSED],
            ),
        ),
    )


def _waiting(heartbeat: timedelta, priority: Priority, final: list[str]) -> Any:
    """Options of the long cloud activities: free to retry, on their own queue, bounded."""
    return heartbeating(
        waits_queue(),
        priority,
        heartbeat,
        start_to_close=timedelta(hours=24),
        retry=RetryPolicy(maximum_interval=timedelta(seconds=60), non_retryable_error_types=final),
    )
