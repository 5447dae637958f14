"""The Temporal calls under spillway.client (and the tests' and benchmarks' jobs): submit, status,
list, decide, each on a temporalio Client, and the edge checks of a graph and a job.

`status` never needs a worker: the plan comes from the workflow's memo (running jobs), its result
(completed) or its failure (failed); progress from the running activity's last heartbeat.
A job's priority travels three ways (docs/clients.md, "Starting jobs from code"): in its input (the
workflow's own use), as Temporal's task priority (its workflow and activity tasks, when a queue
is backlogged) and in its memo, which is where `list` reads it (Temporal's list does not return
an execution's priority). `spillway priority` moves all three: the input and memo through the
workflow's update, the Temporal priority (what the Temporal UI shows) through the execution's
options once the update has succeeded (`follow_priority`).
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from google.protobuf.field_mask_pb2 import FieldMask
from pydantic import BaseModel, ValidationError
from temporalio.api.common.v1 import Priority as PriorityOption
from temporalio.api.common.v1 import WorkflowExecution as ExecutionRef
from temporalio.api.enums.v1 import PendingActivityState
from temporalio.api.workflow.v1 import WorkflowExecutionOptions
from temporalio.api.workflowservice.v1 import UpdateWorkflowExecutionOptionsRequest
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowFailureError,
    WorkflowHandle,
    WorkflowUpdateFailedError,
    WorkflowUpdateRPCTimeoutOrCancelledError,
    WorkflowUpdateStage,
)
from temporalio.common import (
    Priority,
    SearchAttributePair,
    TypedSearchAttributes,
    WorkflowIDReusePolicy,
)
from temporalio.exceptions import ApplicationError, WorkflowAlreadyStartedError
from temporalio.service import RPCError, RPCStatusCode

from spillway.client.queue import spot
from spillway.core import approvals
from spillway.core import search_attributes as sa
from spillway.core.addresses import Refused, check
from spillway.core.errors import ConfigError, Failed, JobNotFound
from spillway.core.models import (
    FINAL_STATES,
    ApprovalDecision,
    CancelNote,
    CloudRequest,
    JobState,
    Plan,
    PriorityChange,
    Progress,
    QueueSpot,
    Quote,
    VideoJob,
)
from spillway.core.names import (
    APPROVAL_SIGNAL,
    CANCEL_NOTE_SIGNAL,
    DECIDE_UPDATE,
    PLAN_MEMO,
    PRIORITY_MEMO,
    PRIORITY_UPDATE,
    QUOTE,
    VIDEO_JOB,
)
from spillway.core.settings import Settings, describe_validation_error

# Temporal refuses payloads over 2 MB; a graph that big is not an API-format graph anyway.
MAX_GRAPH_BYTES = 1_500_000
NAMESPACE_GRACE_S = 30.0  # how long a start asks again when the server denies the namespace


class JobSummary(BaseModel):
    job_id: str
    state: str
    route: str | None
    started: datetime
    host: str | None = None  # the GPU host of a local job
    priority: int | None = None  # 1 (first) .. 5; None: the client that started it set no memo


def read_graph(path: Path) -> dict[str, Any]:
    try:
        size = path.stat().st_size
        if size > MAX_GRAPH_BYTES:
            raise ConfigError(
                f"graph {path} is {size / 1e6:.1f} MB, more than the "
                f"{MAX_GRAPH_BYTES / 1e6:.1f} MB a job can carry: export the API-format graph "
                "(it holds no images or models)"
            )
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read graph {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"graph {path} is not UTF-8 text") from None
    try:
        graph = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ConfigError(f"graph {path} is not JSON: {exc}") from None
    if not isinstance(graph, dict):
        raise ConfigError(f"graph {path} is not an API-format ComfyUI graph (a JSON object)")
    return graph


def check_graph_size(graph: dict[str, Any]) -> None:
    """A graph given as a dict (spillway.client) meets the same limit as a graph file."""
    try:
        size = len(json.dumps(graph, ensure_ascii=False).encode())
    except (TypeError, ValueError) as exc:  # a value JSON has no form for, a cycle
        raise ConfigError(f"the graph cannot be sent as JSON: {exc}") from None
    if size > MAX_GRAPH_BYTES:
        raise ConfigError(
            f"the graph is {size / 1e6:.1f} MB as JSON, more than the "
            f"{MAX_GRAPH_BYTES / 1e6:.1f} MB a job can carry: export the API-format graph "
            "(it holds no images or models)"
        )


def check_callback_url(url: str) -> str:
    """An http(s) URL with a host. Never shown in a message: a callback URL may hold a token."""
    wrong = ConfigError(
        "--callback-url must be an http(s) URL with a host, such as "
        "https://example.com/hooks/spillway (the value is not shown: it may hold a token)"
    )
    if len(url) > 2000 or any(c.isspace() for c in url):
        raise wrong
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 -- raises ValueError for a port that is not a number
    except ValueError:
        raise wrong from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise wrong
    return url


async def check_addresses(job: VideoJob, settings: Settings) -> None:
    """The job's input URLs and its callback URL, held to the rule the workers apply
    (spillway/core/addresses.py), so a refused one fails here, before anything starts."""
    for item in job.inputs:
        if item.uri.startswith(("http://", "https://")):
            try:
                await check(item.uri, settings.input_allow_hosts)
            except Refused as exc:
                raise ConfigError(f"--input {item.node}: {exc}") from None
    if job.callback_url is not None:
        try:
            await check(job.callback_url, settings.input_allow_hosts)
        except Refused as exc:
            raise ConfigError(f"--callback-url: {exc}") from None


def build_job(
    job_id: str,
    graph: dict[str, Any],
    prompt: str | None,
    cloud_options: dict[str, Any],
    *,
    callback_url: str | None = None,
    priority: int = 3,
    max_wait_s: float | None = None,
    deadline: datetime | None = None,
    team: str | None = None,
) -> VideoJob:
    """Validates everything at the edge: nothing starts with a bad graph or cloud request."""
    if prompt is None and cloud_options:
        raise ConfigError(f"{', '.join('--' + k for k in cloud_options)} needs --prompt")
    if callback_url is not None:
        check_callback_url(callback_url)
    try:
        cloud = CloudRequest(prompt=prompt, **cloud_options) if prompt is not None else None
        return VideoJob(
            job_id=job_id,
            graph=graph,
            cloud=cloud,
            callback_url=callback_url,
            priority=priority,
            max_wait_s=max_wait_s,
            deadline=deadline,
            team=team,
        )
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "job")) from None


async def submit(client: Client, job: VideoJob, task_queue: str) -> WorkflowHandle[Any, Plan]:
    nodes = ", ".join(sorted({n["class_type"] for n in job.graph.values()}))
    cloud = f'cloud prompt: "{job.cloud.prompt[:80]}"' if job.cloud else "local only"
    plan = Plan(job_id=job.job_id)
    attributes: list[SearchAttributePair[Any]] = [SearchAttributePair(sa.STATE, plan.state)]
    if job.team is not None:
        attributes.append(SearchAttributePair(sa.TEAM, job.team))
    asked_since = time.monotonic()
    while True:
        try:
            return await client.start_workflow(
                VIDEO_JOB,
                job,
                id=job.job_id,
                task_queue=task_queue,
                result_type=Plan,
                id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
                priority=Priority(priority_key=job.priority),
                # What the job's first workflow task would publish, set at once: `status` and
                # `list` know the job before a worker picks it up, and the workflow upserts
                # nothing then (workflows/job_state.py).
                memo={PLAN_MEMO: plan, PRIORITY_MEMO: job.priority},
                search_attributes=TypedSearchAttributes(attributes),
                static_summary=f"video job {job.job_id}: {len(job.graph)} nodes; {cloud}",
                static_details=f"ComfyUI nodes: {nodes}",
            )
        except WorkflowAlreadyStartedError:
            raise Failed(f"job {job.job_id} already exists: choose another --job-id") from None
        except RPCError as exc:
            unregistered = any(key.name in exc.message for key in sa.ALL)
            if exc.status == RPCStatusCode.INVALID_ARGUMENT and unregistered:
                raise Failed(
                    f"{exc.message}: run `spillway init` once for this namespace"
                ) from None
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            # The namespace, denied: a dev server starved of CPU has denied the one it serves.
            # A start denied so started nothing, so it is asked again for a while.
            if time.monotonic() - asked_since >= NAMESPACE_GRACE_S:
                raise Failed(
                    f"{exc.message.rstrip('.')} (asked for {NAMESPACE_GRACE_S:.0f} s): is "
                    f"TEMPORAL_NAMESPACE right? `temporal operator namespace list` names them"
                ) from None
            await asyncio.sleep(1.0)


async def status(client: Client, job_id: str) -> Plan:
    handle = client.get_workflow_handle(job_id, result_type=Plan)
    description = await _described(handle, job_id)
    plan = await description.memo_value(PLAN_MEMO, None, type_hint=Plan) or Plan(job_id=job_id)
    match description.status:
        case WorkflowExecutionStatus.COMPLETED:
            result: Plan = await handle.result()
            return out_of_line(result)
        case WorkflowExecutionStatus.FAILED:
            plan.state, plan.error = "failed", plan.error or await _failure(handle)
        case WorkflowExecutionStatus.CANCELED:
            plan.state = "cancelled"
        case WorkflowExecutionStatus.TERMINATED | WorkflowExecutionStatus.TIMED_OUT:
            plan.state, plan.error = "failed", await _failure(handle)
        case _:
            plan.progress = await _progress(client, description.raw_description)
            if plan.state in ("queued", "awaiting_approval"):
                plan.queue = await spot(client, description.task_queue, job_id, plan.queue)
    return out_of_line(plan)


LEFT_LINE: tuple[JobState, ...] = (
    "running_local",
    "running_cloud",
    "completed",
    "failed",
    "cancelled",
)


def out_of_line(plan: Plan) -> Plan:
    """A job that has left the GPU line has no place in it and no patience: the plan it last
    published may still carry both (a cancel or a place ends the wait before the next
    publication, and old runs kept them to the end)."""
    if plan.state in LEFT_LINE:
        plan.queue = plan.patience_until = None
    return plan


async def _failure(handle: WorkflowHandle[Any, Any]) -> str:
    try:
        await handle.result()
    except WorkflowFailureError as err:
        return _message(err.cause or err)
    return "failed"


def _message(err: BaseException) -> str:
    return err.message if isinstance(err, ApplicationError) else str(err)


async def _progress(client: Client, raw: Any) -> Progress | None:
    for pending in raw.pending_activities:
        if pending.state != PendingActivityState.PENDING_ACTIVITY_STATE_STARTED:
            continue
        payloads = pending.heartbeat_details.payloads
        if payloads:
            [progress] = await client.data_converter.decode(payloads[:1], [Progress])
            if isinstance(progress, Progress):
                return progress
    return None


async def list_jobs(
    client: Client,
    state: JobState | None,
    team: str | None = None,
    default_team: bool = False,
    limit: int | None = None,
    task_queue: str | None = None,
) -> list[JobSummary]:
    """`team`: only its jobs; `default_team`: it is the default team, whose jobs include those
    started without a team (before the teams file, or by a client that set none); `limit`: the
    newest that many only (the console's recent jobs, on a server holding thousands);
    `task_queue`: only the jobs started on it (a namespace may hold several spillways)."""
    query = f"WorkflowType = '{VIDEO_JOB}'"
    if task_queue is not None:
        query += f" AND TaskQueue = '{task_queue}'"
    if state is not None:
        query += f" AND {sa.STATE.name} = '{state}'"
    if team is not None:
        own = f"{sa.TEAM.name} = '{team}'"
        query += f" AND ({own} OR {sa.TEAM.name} IS NULL)" if default_team else f" AND {own}"
    jobs = []
    async for execution in client.list_workflows(query, limit=limit):
        attributes = execution.typed_search_attributes
        jobs.append(
            JobSummary(
                job_id=execution.id,
                state=attributes.get(sa.STATE) or "probing",
                route=attributes.get(sa.ROUTE),
                started=execution.start_time,
                host=attributes.get(sa.HOST),
                priority=await _priority(execution),
            )
        )
    return jobs


async def _priority(execution: WorkflowExecution) -> int | None:
    """The memo's priority; a raw client's memo may hold anything, or nothing."""
    try:
        value = await execution.memo_value(PRIORITY_MEMO, None)
    except Exception:  # a payload this converter cannot read
        return None
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 5:
        return value
    return None


BINDING_PATIENCE_S = 10.0


async def binding(client: Client, job_id: str, approved: bool) -> approvals.Binding:
    """What a decision for this job is signed for: its incarnation (Temporal's first run id of
    the job) and, for an approval, the provider and clip cost key its plan shows it waits for
    (the workers read them). Failed when the job is not there or shows neither yet."""
    description = await _described(client.get_workflow_handle(job_id), job_id)
    info = description.raw_description.workflow_execution_info
    bound = approvals.Binding(job_id=job_id, incarnation=info.first_run_id or description.run_id)
    if not approved:
        return bound
    # The job says it waits a moment before it has read what it waits for.
    give_up = time.monotonic() + BINDING_PATIENCE_S
    while True:
        plan = await status(client, job_id)
        view = plan.budget
        if view is not None and view.provider and view.cost_key:
            break
        if plan.state != "awaiting_approval" or time.monotonic() > give_up:
            raise Failed(
                f"job {job_id} does not show which provider and clip it waits for (state: "
                f"{plan.state}): an approval is signed for both; try again in a moment"
            )
        await asyncio.sleep(0.2)
    return bound.model_copy(update={"provider": view.provider, "cost_key": view.cost_key})


async def decide(client: Client, job_id: str, decision: ApprovalDecision) -> str:
    """Approve or reject through the workflow's update, so a job that is not waiting refuses
    with its reason. With no worker answering, the decision goes as a signal, applied when a
    worker runs (the workflow records it as ignored if the job has moved on by then)."""
    current = await status(client, job_id)
    if current.state != "awaiting_approval":
        raise Failed(f"job {job_id} is not awaiting approval (state: {current.state})")
    handle = client.get_workflow_handle(job_id, result_type=Plan)
    try:
        accepted = await handle.start_update(
            DECIDE_UPDATE,
            decision,
            result_type=str,
            wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            rpc_timeout=timedelta(seconds=5),
        )
    except WorkflowUpdateFailedError as err:
        raise Failed(await _decision_refused(client, job_id, err)) from None
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        await handle.signal(APPROVAL_SIGNAL, decision)
        sent = "sent as a signal: no worker answered; it applies when a worker runs"
        if decision.expires_at is not None:
            sent += f" before {decision.expires_at:%H:%M} UTC, when its signature expires"
        return sent
    # Accepted: the answer comes once the job has used the decision (an approval reserves its
    # cost in the spend ledger first, and the budget may refuse it).
    try:
        answer: str = await accepted.result(rpc_timeout=timedelta(seconds=60))
        return answer
    except WorkflowUpdateFailedError as err:
        raise Failed(await _decision_refused(client, job_id, err)) from None
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        return f"accepted; still being applied: see spillway status {job_id}"


# What Temporal itself answers an update whose workflow run ended before the handler did (a job
# that failed while it used the approval) or before it was accepted: not the job's own words.
RUN_ENDED_FIRST = ("completed before the Update completed", "update was aborted")


def ended_first(message: str) -> bool:
    return any(text.lower() in message.lower() for text in RUN_ENDED_FIRST)


def ended_before_answer(job_id: str, plan: Plan) -> str:
    why = f": {plan.error}" if plan.error else ""
    return (
        f"job {job_id} ended ({plan.state}) before it answered this decision{why} "
        f"(spillway status {job_id})"
    )


async def _decision_refused(client: Client, job_id: str, err: WorkflowUpdateFailedError) -> str:
    message = _message(err.cause or err)
    if not ended_first(message):
        return message
    return ended_before_answer(job_id, await status(client, job_id))


QUOTE_WITHIN = timedelta(seconds=30)  # the hosts' probes and fits take 10 s at most each


async def quote(client: Client, task_queue: str, job: VideoJob) -> Quote:
    """SpillwayQuoteWorkflow on the workers' queue, under an id of its own (the job's id is
    not taken)."""
    try:
        found: Quote = await client.execute_workflow(
            QUOTE,
            job,
            id=f"spillway-quote-{uuid.uuid4().hex[:12]}",
            task_queue=task_queue,
            result_type=Quote,
            execution_timeout=QUOTE_WITHIN,
        )
    except WorkflowFailureError as err:
        if isinstance(err.cause, ApplicationError):
            raise Failed(err.cause.message) from None
        raise Failed(
            f"no worker answered on task queue {task_queue!r} within "
            f"{QUOTE_WITHIN.total_seconds():g} s: start one (spillway worker)"
        ) from None
    return found


async def set_priority(client: Client, job_id: str, change: PriorityChange) -> QueueSpot | None:
    """A waiting job's new priority, through the workflow's update: its place in the line once
    the pool has moved it (None: it got a place at once). Failed for a job that is not waiting
    in the line (one that has ended, naming its state), or when no worker answers."""
    not_waiting = (
        "only a job waiting in the GPU line (queued, or awaiting_approval) changes its priority"
    )
    await _not_ended(client, job_id, not_waiting)  # not found: Failed, naming it
    handle = client.get_workflow_handle(job_id, result_type=Plan)
    try:
        spot: QueueSpot | None = await handle.execute_update(
            PRIORITY_UPDATE, change, result_type=QueueSpot, rpc_timeout=timedelta(seconds=30)
        )
    except WorkflowUpdateFailedError as err:
        raise Failed(_message(err.cause or err)) from None
    except WorkflowUpdateRPCTimeoutOrCancelledError:
        raise Failed(
            f"job {job_id}: no worker answered within 30 s; its priority is unchanged "
            "(start one: spillway worker)"
        ) from None
    except RPCError:
        await _ended_meanwhile(client, job_id, not_waiting)
        raise
    return spot


async def follow_priority(client: Client, job_id: str, priority: int) -> str | None:
    """The execution's Temporal priority (the one the Temporal UI shows, and its workflow tasks
    queue by) set to the job's new one, after the job's own update took it. None once done, or
    when the job has ended meanwhile (nothing left to queue or show); otherwise one line saying
    why it could not: a server without UpdateWorkflowExecutionOptions (before 1.28, and the
    time-skipping test server) keeps the priority the job started with. The job's own priority
    changed either way, so this never raises."""
    request = UpdateWorkflowExecutionOptionsRequest(
        namespace=client.namespace,
        workflow_execution=ExecutionRef(workflow_id=job_id),
        workflow_execution_options=WorkflowExecutionOptions(
            priority=PriorityOption(priority_key=priority)
        ),
        update_mask=FieldMask(paths=["priority"]),
        identity=client.identity,
    )
    try:
        await client.workflow_service.update_workflow_execution_options(
            request, retry=True, timeout=timedelta(seconds=10)
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return None
        what = (
            "this Temporal server cannot change a workflow's priority"
            if exc.status == RPCStatusCode.UNIMPLEMENTED
            else f"Temporal refused to change the workflow's priority ({exc.message})"
        )
        return (
            f"job {job_id}: {what}; the job and its line use priority {priority}, the Temporal "
            "UI still shows the one it started with"
        )
    return None


async def cancel(client: Client, job_id: str, note: CancelNote) -> None:
    """Who cancels and why (a signal the job records in its plan), then the cancel request
    itself. Failed for a job not found or already ended, naming its state. The job shows
    `cancelled` once it has let go of what it holds (a ComfyUI render stops at its next node
    boundary; a cloud create in flight is awaited): `SpillwayClient.cancel` waits for that."""
    await _not_ended(client, job_id, "nothing to cancel")
    handle = client.get_workflow_handle(job_id, result_type=Plan)
    try:
        await handle.signal(CANCEL_NOTE_SIGNAL, note)
        await handle.cancel()
    except RPCError:
        await _ended_meanwhile(client, job_id, "nothing to cancel")
        raise


async def _not_ended(client: Client, job_id: str, so: str) -> None:
    state = (await status(client, job_id)).state
    if state in FINAL_STATES:
        raise Failed(f"job {job_id} has already ended ({state}): {so}")


async def _ended_meanwhile(client: Client, job_id: str, so: str) -> None:
    """After an RPC error: a job that ended since it was read is said as its state, not as
    Temporal's "workflow execution already completed" (any other error is the caller's)."""
    await _not_ended(client, job_id, so)


async def _described(handle: WorkflowHandle[Any, Any], job_id: str) -> WorkflowExecutionDescription:
    try:
        return await handle.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise JobNotFound(f"job {job_id} not found") from None
        raise
