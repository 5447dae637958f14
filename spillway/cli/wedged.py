"""How `spillway health` finds a running workflow that is wedged (`WedgedWorkflow`): the spend
ledger and the GPU pool alike, each with its own remedy."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel

if TYPE_CHECKING:
    from temporalio.api.history.v1 import HistoryEvent
    from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionResponse
    from temporalio.client import Client


class WedgedWorkflow(BaseModel):
    """A running workflow whose workflow task fails and is retried (a nondeterminism error after
    a deploy, a bug in its code): it answers no update, query or signal until someone steps in.
    Read off DescribeWorkflowExecution (the pending workflow task's attempt) and the tail of its
    history (the last WorkflowTaskFailed event: the retries themselves write no events)."""

    workflow_id: str
    run_id: str
    attempt: int  # the pending workflow task's attempt: 2 = it failed once and is retried
    failing_since: datetime | None = None  # when the failing task was first scheduled
    cause: str | None = None  # e.g. NON_DETERMINISTIC_ERROR, WORKFLOW_WORKER_UNHANDLED_FAILURE
    failure: str | None = None  # the failure's message, its first line
    remedy: str


# How far back from a history's end the last failed workflow task is looked for (events).
HISTORY_TAIL = 100


def failing(found: WedgedWorkflow) -> str:
    since = found.failing_since
    when = f", failing since {since:%Y-%m-%d %H:%M:%S} UTC" if since is not None else ""
    why = "".join(f": {w}" for w in (found.cause, found.failure) if w)
    return f"its workflow task failed and is being retried (attempt {found.attempt}{when}){why}"


async def wedged(client: Client, workflow_id: str, remedy: str) -> WedgedWorkflow | None:
    """The workflow, if it runs with a workflow task that failed and is being retried; None when
    it runs normally, is closed or unknown, or cannot be read (the other checks say why)."""
    from temporalio.service import RPCError

    from activities.spend.ledger import RPC_TIMEOUT

    try:
        described = await client.get_workflow_handle(workflow_id).describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError:
        return None
    return await wedged_run(client, described.raw_description, remedy)


async def wedged_run(
    client: Client, info: DescribeWorkflowExecutionResponse, remedy: str
) -> WedgedWorkflow | None:
    from temporalio.api.enums.v1 import WorkflowExecutionStatus

    workflow_id = info.workflow_execution_info.execution.workflow_id
    task = info.pending_workflow_task
    running = WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING
    if (
        info.workflow_execution_info.status != running
        or not info.HasField("pending_workflow_task")
        or task.attempt <= 1
    ):
        return None
    run_id = info.workflow_execution_info.execution.run_id
    cause, failure = await _last_task_failure(client, workflow_id, run_id)
    return WedgedWorkflow(
        workflow_id=workflow_id,
        run_id=run_id,
        attempt=task.attempt,
        failing_since=task.original_scheduled_time.ToDatetime(tzinfo=UTC)
        if task.HasField("original_scheduled_time")
        else None,
        cause=cause,
        failure=failure,
        remedy=remedy,
    )


async def _last_task_failure(
    client: Client, workflow_id: str, run_id: str
) -> tuple[str | None, str | None]:
    """(cause, the failure's first line) of the run's last failed or timed-out workflow task,
    read backwards from the history's end, at most HISTORY_TAIL events; (None, None) if none."""
    from temporalio.api.enums.v1 import EventType, TimeoutType, WorkflowTaskFailedCause

    for event in await history_tail(client, workflow_id, run_id):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failed = event.workflow_task_failed_event_attributes
            message = failed.failure.message.strip().splitlines()
            cause = enum_name(WorkflowTaskFailedCause, failed.cause, "WORKFLOW_TASK_FAILED_CAUSE_")
            return cause, message[0][:300] if message else None
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            timeout = event.workflow_task_timed_out_event_attributes.timeout_type
            return "TIMED_OUT", enum_name(TimeoutType, timeout, "TIMEOUT_TYPE_")
    return None, None


async def history_tail(client: Client, workflow_id: str, run_id: str) -> list[HistoryEvent]:
    """The run's last HISTORY_TAIL events, newest first; none when they cannot be read."""
    from temporalio.api.common.v1 import WorkflowExecution
    from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest
    from temporalio.service import RPCError

    from activities.spend.ledger import RPC_TIMEOUT

    try:
        page = await client.workflow_service.get_workflow_execution_history_reverse(
            GetWorkflowExecutionHistoryReverseRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
                maximum_page_size=HISTORY_TAIL,
            ),
            timeout=RPC_TIMEOUT,
        )
    except RPCError:
        return []
    return list(page.history.events)


async def reset_from(client: Client, workflow_id: str, run_id: str) -> str | None:
    """The run whose history the run's began as, when an operator's reset made it (its first
    event keeps the run id it was written under); None otherwise or when it cannot be read."""
    from temporalio.api.common.v1 import WorkflowExecution
    from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryRequest
    from temporalio.service import RPCError

    from activities.spend.ledger import RPC_TIMEOUT

    try:
        page = await client.workflow_service.get_workflow_execution_history(
            GetWorkflowExecutionHistoryRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
                maximum_page_size=1,
            ),
            timeout=RPC_TIMEOUT,
        )
    except RPCError:
        return None
    if not page.history.events:
        return None
    started = page.history.events[0].workflow_execution_started_event_attributes
    original = started.original_execution_run_id
    return original if original and original != run_id else None


def enum_name(enum: Any, value: int, prefix: str) -> str:
    """A protobuf enum value's name without its prefix; the number when this SDK does not know
    it (a newer server)."""
    return enum.Name(value).removeprefix(prefix) if value in enum.values() else str(value)
