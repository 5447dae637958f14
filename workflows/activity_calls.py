"""Every activity VideoJobWorkflow and the health workflow run, called typed
(`execute_activity_method` on the activity classes, so mypy checks inputs and results) with the
timeouts, retry policies and queues that make the money invariants hold and let an agent die
without losing or doubling a render. Test workflows call the same functions, so what they prove
is what runs.

Workflow code only: these functions must be awaited inside a workflow.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Generic, TypeVar

from temporalio import workflow
from temporalio.common import Priority, RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutType
from temporalio.exceptions import TimeoutError as ActivityTimeout
from temporalio.workflow import ActivityHandle

with workflow.unsafe.imports_passed_through():
    from activities.approvals import ApprovalActivities, ApprovalCheck, ApprovalVerdict
    from activities.cloud.models import (
        CloudCreate,
        CloudCreated,
        CloudDone,
        CloudDownload,
        CloudPoll,
        LostCreate,
        Reconciled,
    )
    from activities.cloud.provider import CloudProvider
    from activities.comfyui import models as comfyui
    from activities.comfyui.activities import ComfyUIActivities
    from activities.comfyui.capabilities import needs
    from activities.notify import NotifyActivities
    from activities.policy import PolicyActivities, PolicyRequest
    from activities.pool import (
        FindHolders,
        HolderCheck,
        HoldersChecked,
        HoldersFound,
        PlacesRead,
        PoolActivities,
        ReadPlaces,
    )
    from activities.probe.activities import LoadProbeRequest, LoadStatusActivities
    from activities.spend.activities import SpendActivities, SpendRequest
    from spillway.core.gpu_pool import LateCheck, PoolAsk, PoolLeave, PoolQuote, Quoted
    from spillway.core.hosts import WAITS_SUFFIX
    from spillway.core.ledger import BudgetView, Reservation, SpendEntry, SpendSettle
    from spillway.core.models import ApprovalNotice, Downloaded, HostRef, LoadStatus, Policy

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

_Req = TypeVar("_Req")
_Result = TypeVar("_Result")


def heartbeating(
    task_queue: str | None,
    priority: Priority,
    heartbeat: timedelta,
    *,
    start_to_close: timedelta,
    retry: RetryPolicy,
) -> Any:
    """`execute_activity_method`'s options for an activity that heartbeats: `heartbeat` is how
    soon a dead worker's activity moves on; `task_queue` None is the workflow's own."""
    return {
        "task_queue": task_queue,
        "priority": priority,
        "start_to_close_timeout": start_to_close,
        "heartbeat_timeout": heartbeat,
        "retry_policy": retry,
    }


def _retried_but(*final: str, longest: timedelta = timedelta(seconds=30)) -> RetryPolicy:
    return RetryPolicy(maximum_interval=longest, non_retryable_error_types=[*final])


# --- the policy, the probe, the approval webhook and signature ------------------------------------


async def read_policy(job_id: str, *, local: bool = False) -> Policy:
    """On the worker's own queue (it serves `read_policy`). `local`: as a local activity, only
    for a run that began so (a job of 0.4.0 or earlier): a signal or update that arrives while a
    local activity runs can reach the workflow code in another activation on replay than it did
    live (temporalio 1.35), and a run that then issues its commands in another order fails at the
    next worker that replays it (docs/design.md, "Facts found while building")."""
    request = PolicyRequest(job_id=job_id)
    timeout = timedelta(seconds=30)
    read = PolicyActivities.read_policy
    if local:
        return await workflow.execute_local_activity_method(
            read, request, start_to_close_timeout=timeout, retry_policy=FREE_RETRY
        )
    return await workflow.execute_activity_method(
        read, request, start_to_close_timeout=timeout, retry_policy=FREE_RETRY
    )


async def probe(job_id: str, host: HostRef, priority: Priority = Priority.default) -> LoadStatus:
    """On the host's agent, bounded (docs/design.md, "GPU hosts and agents"): an agent that does
    not pick the probe up within PROBE_BOUND (down, or gone mid-probe and not back) fails it,
    and the caller reads that as "no answer" (fail-open: unreachable needs two). A probe that
    raises is retried."""
    return await workflow.execute_activity_method(
        LoadStatusActivities.a40_load_status,
        LoadProbeRequest(job_id=job_id),
        task_queue=host.task_queue,
        priority=priority,
        schedule_to_start_timeout=PROBE_BOUND,  # never retried: the agent is not there
        start_to_close_timeout=timedelta(seconds=60),
        retry_policy=FREE_RETRY,
    )


async def comfyui_fit(
    job_id: str, host: HostRef, graph: dict[str, Any], priority: Priority = Priority.default
) -> comfyui.HostFit:
    """Whether the host can run the graph, on its agent (which keeps what its ComfyUI has);
    bounded as a probe is: an agent that is not there fails it, and the host is not ruled out."""
    return await workflow.execute_activity_method(
        ComfyUIActivities.fit,
        comfyui.ComfyUIFit(job_id=job_id, needs=needs(graph)),
        task_queue=host.task_queue,
        priority=priority,
        schedule_to_start_timeout=PROBE_BOUND,
        start_to_close_timeout=timedelta(seconds=60),
        retry_policy=RetryPolicy(maximum_attempts=2),
    )


# --- the GPU pool --------------------------------------------------------------------------------


async def pool_start(ask: PoolAsk) -> None:
    """Signal-with-start: the ask of a job that found no GPU pool running."""
    await workflow.execute_activity_method(
        PoolActivities.start,
        ask,
        start_to_close_timeout=timedelta(seconds=10),
        retry_policy=FREE_RETRY,
    )


async def pool_start_by_leave(leave: PoolLeave) -> None:
    """Signal-with-start: the give-back of a job that found no GPU pool running."""
    await workflow.execute_activity_method(
        PoolActivities.start_by_leave,
        leave,
        start_to_close_timeout=timedelta(seconds=10),
        retry_policy=FREE_RETRY,
    )


async def pool_read_places(read: ReadPlaces) -> PlacesRead:
    return await workflow.execute_activity_method(
        PoolActivities.read_places,
        read,
        start_to_close_timeout=timedelta(seconds=60),
        retry_policy=RetryPolicy(maximum_attempts=2),
    )


async def pool_check(check: HolderCheck) -> HoldersChecked:
    return await workflow.execute_activity_method(
        PoolActivities.check_holders,
        check,
        start_to_close_timeout=timedelta(seconds=60),
        retry_policy=RetryPolicy(maximum_attempts=2),
    )


async def pool_clear(
    prompt_id: str, host: HostRef, *, whole_run: bool = False
) -> comfyui.ComfyUICancelled:
    """A left place's prompt out of the host's ComfyUI (`comfyui_cancel` on its agent), or with
    `whole_run` every prompt of its run, before the place is free again. Bounded: a host
    or agent that does not answer keeps the place held, and the pool tries again later."""
    options = heartbeating(
        host.task_queue,
        Priority.default,
        timedelta(seconds=30),
        start_to_close=timedelta(minutes=2),
        retry=FREE_RETRY,
    )
    return await workflow.execute_activity_method(
        ComfyUIActivities.cancel,
        comfyui.ComfyUICancel(prompt_id=prompt_id, whole_run=whole_run),
        schedule_to_start_timeout=PROBE_BOUND,
        schedule_to_close_timeout=timedelta(minutes=2),
        **options,
    )


async def pool_find(find: FindHolders) -> HoldersFound:
    return await workflow.execute_activity_method(
        PoolActivities.find_holders,
        find,
        start_to_close_timeout=timedelta(minutes=2),
        retry_policy=RetryPolicy(maximum_attempts=2),
    )


async def pool_confirm_late(ask: PoolAsk) -> LateCheck:
    """Bounded and never raising past its retries: a pool that cannot say keeps the job in line
    (see `PoolActivities.confirm_late`)."""
    return await workflow.execute_activity_method(
        PoolActivities.confirm_late,
        ask,
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_attempts=2),
    )


async def pool_quote(req: PoolQuote) -> Quoted:
    return await workflow.execute_activity_method(
        PoolActivities.quote,
        req,
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_attempts=2),
    )


async def notify(notice: ApprovalNotice) -> None:
    await workflow.execute_activity_method(
        NotifyActivities.notify_approval_needed,
        notice,
        start_to_close_timeout=timedelta(seconds=30),
        retry_policy=RetryPolicy(maximum_attempts=5, initial_interval=timedelta(seconds=2)),
    )


async def approval_verify(req: ApprovalCheck) -> ApprovalVerdict:
    """Free and quick, so retried; but bounded: a decision the workers cannot check within this
    is not used (money fails closed) and its sender hears so."""
    return await workflow.execute_activity_method(
        ApprovalActivities.verify,
        req,
        start_to_close_timeout=timedelta(seconds=10),
        schedule_to_close_timeout=timedelta(minutes=1),
        retry_policy=FREE_RETRY,
    )


# --- the LOCAL route: ComfyUI on the job's GPU host -----------------------------------------------


@dataclass(frozen=True)
class HostCall(Generic[_Req, _Result]):
    """One ComfyUI activity, run on the job's host: its agent's queue, or its waits queue."""

    method: Callable[[ComfyUIActivities, _Req], Awaitable[_Result]]
    start_to_close: timedelta
    retry: RetryPolicy
    waits: bool = False  # on the host's waits queue and slot pool

    async def __call__(
        self,
        req: _Req,
        heartbeat: timedelta,
        host: HostRef,
        priority: Priority = Priority.default,
        *,
        agent_bound: timedelta | None = None,
    ) -> _Result:
        """`priority`: the job's own (Priority.default: the workflow's, which its client may
        have set). `agent_bound`: how long each attempt may wait for the host's agent to pick
        it up; past it the call fails with a schedule-to-start timeout (`agent_gone`)."""
        queue = host.waits_queue if self.waits else host.task_queue
        options = heartbeating(
            queue, priority, heartbeat, start_to_close=self.start_to_close, retry=self.retry
        )
        if agent_bound is not None:
            options["schedule_to_start_timeout"] = agent_bound
        return await workflow.execute_activity_method(self.method, req, **options)


def host_silence(err: ActivityError) -> comfyui.Silence | None:
    """What a host call hands on when the host's silence ended it (HOST_SILENT); None for any
    other failure."""
    cause = err.cause
    if not (isinstance(cause, ApplicationError) and cause.type == comfyui.HOST_SILENT):
        return None
    return comfyui.Silence.model_validate(cause.details[0])


def place_taken(err: ActivityError) -> bool:
    """The submit found no place of the job's in the GPU pool (PLACE_TAKEN), or no pool running
    (NO_POOL): nothing posted."""
    cause = err.cause
    kinds = (comfyui.PLACE_TAKEN, comfyui.NO_POOL)
    return isinstance(cause, ApplicationError) and cause.type in kinds


def earlier_run_holds(err: ActivityError) -> list[str]:
    """The prompts of the run this one was reset from that the submit found in ComfyUI
    (EARLIER_RUN_HOLDS: nothing posted); empty for any other failure."""
    cause = err.cause
    if not (isinstance(cause, ApplicationError) and cause.type == comfyui.EARLIER_RUN_HOLDS):
        return []
    return [str(p) for p in cause.details[0]] if cause.details else []


def agent_gone(err: ActivityError) -> bool:
    """The host's agent did not pick the call up within its `agent_bound`."""
    cause = err.cause
    return isinstance(cause, ActivityTimeout) and cause.type == TimeoutType.SCHEDULE_TO_START


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
comfyui_download: HostCall[comfyui.ComfyUIDownload, comfyui.ComfyUIDownloaded] = HostCall(
    ComfyUIActivities.download, timedelta(hours=6), FREE_RETRY, waits=True
)
comfyui_cancel: HostCall[comfyui.ComfyUICancel, comfyui.ComfyUICancelled] = HostCall(
    ComfyUIActivities.cancel, timedelta(minutes=10), FREE_RETRY
)


# --- the spend ledger -------------------------------------------------------------------------


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


# --- the CLOUD route: whichever provider the job is on ------------------------------------------


def cloud_create(
    provider: CloudProvider,
    req: CloudCreate,
    heartbeat: timedelta,
    priority: Priority = Priority.default,
) -> ActivityHandle[CloudCreated]:
    """Started, not awaited: the caller shields it, because a create once sent is never
    abandoned (a cancelled job still records the task it ordered). Never retried by Temporal
    (money invariant 2): a provider that can be asked whether its task exists (Kling, by its
    external task id) does so inside the activity."""
    return workflow.start_activity_method(
        provider.activities.create,
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
    provider: CloudProvider,
    req: CloudPoll,
    heartbeat: timedelta,
    priority: Priority = Priority.default,
) -> CloudDone:
    return await workflow.execute_activity_method(
        provider.activities.poll, req, **_waiting(heartbeat, priority, provider.poll_final)
    )


async def cloud_download(
    provider: CloudProvider,
    req: CloudDownload,
    heartbeat: timedelta,
    priority: Priority = Priority.default,
) -> Downloaded:
    return await workflow.execute_activity_method(
        provider.activities.download,
        req,
        **_waiting(heartbeat, priority, provider.download_final),
    )


async def cloud_reconcile(
    provider: CloudProvider,
    req: LostCreate,
    heartbeat: timedelta,
    priority: Priority = Priority.default,
) -> Reconciled:
    """Free, and bounded: a provider that will not answer within this leaves the job failed as
    before, saying a charge may exist (the ledger keeps it as maybe_charged)."""
    return await workflow.execute_activity_method(
        provider.activities.reconcile,
        req,
        schedule_to_close_timeout=timedelta(minutes=30),
        **heartbeating(
            waits_queue(),
            priority,
            heartbeat,
            start_to_close=timedelta(minutes=15),  # a create's longest run, and then some
            retry=_retried_but(*provider.refused, longest=timedelta(seconds=60)),
        ),
    )


def _waiting(heartbeat: timedelta, priority: Priority, final: tuple[str, ...]) -> Any:
    """Options of the long cloud activities: free to retry, on their own queue, bounded."""
    return heartbeating(
        waits_queue(),
        priority,
        heartbeat,
        start_to_close=timedelta(hours=24),
        retry=_retried_but(*final, longest=timedelta(seconds=60)),
    )
