"""`spillway load` and `spillway health`: the live load status and the whole trigger logic, the way
the original system's /health showed them (docs/design.md, "What spillway is and where it came
from"). Never shows a key, only whether one is present."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal

import httpx
from pydantic import BaseModel

from activities.cloud import registry as clouds
from activities.probe.activities import LoadStatusActivities
from activities.probe.nvml import NvmlReader
from spillway.decision import table_rows
from spillway.errors import Failed
from spillway.models import LoadStatus, WorkersView
from spillway.settings import Settings, shown
from spillway.spend_book import PeriodTotals
from spillway.tiers import RoutingTiers

if TYPE_CHECKING:
    from temporalio.api.history.v1 import HistoryEvent
    from temporalio.api.workflowservice.v1 import DescribeWorkflowExecutionResponse
    from temporalio.client import Client

TRIGGER = (
    "overloaded = VRAM busy OR (GPU util busy AND queue backlog) OR guard busy; "
    "a source that fails counts as not overloaded (fail-open)"
)
DECISION = [
    f"reachable {r}, overloaded {o}, armed {a} -> {route}" for r, o, a, route in table_rows()
]


class Source(BaseModel):
    name: str
    endpoint: str | None  # None: not configured, skipped
    rule: str


class ProviderHealth(BaseModel):
    name: str
    tier: int | None
    base_url: str
    key_present: bool  # yes/no, never the key


class CloudFallback(BaseModel):
    provider: str  # the first one in CLOUD_PROVIDERS, with its tier, API and key
    tier: int | None
    base_url: str
    fallback_enabled: bool
    key_present: bool
    armed: bool
    order: list[str]  # CLOUD_PROVIDERS: the providers tried in turn, those with keys
    providers: list[ProviderHealth]  # every provider of CLOUD_PROVIDERS


class Approval(BaseModel):
    timeout_s: float
    recheck_s: float
    webhook_configured: bool
    # SPILLWAY_APPROVAL_SECRET: in this shell (its approve|reject are signed), and on the workers
    # (they use only signed decisions; None: no worker answered).
    signed: bool = False
    workers_signed: bool | None = None
    who_can_approve: str = ""


OPEN_TO_NAMESPACE = (
    'anyone who can signal the namespace (the Temporal UI\'s "Send a Signal" included) can '
    "approve spending: set SPILLWAY_APPROVAL_SECRET on the workers and on the approvers' machines "
    "to require signed decisions"
)


def who_can_approve(shell_signed: bool, workers_signed: bool | None) -> str:
    """Who can send a job to the paid cloud by deciding, as far as this shell can tell."""
    if workers_signed is None:
        if not shell_signed:
            return OPEN_TO_NAMESPACE + " (this shell's setting: no worker answered)"
        return (
            "this shell signs its decisions (SPILLWAY_APPROVAL_SECRET); whether the workers "
            "require signed ones is unknown: no worker answered"
        )
    if not workers_signed:
        also = " (this shell signs, but the workers do not check)" if shell_signed else ""
        return OPEN_TO_NAMESPACE + also
    if shell_signed:
        return "only holders of SPILLWAY_APPROVAL_SECRET: the workers use signed decisions only"
    return (
        "only holders of SPILLWAY_APPROVAL_SECRET: the workers use signed decisions only, and "
        "this shell has no secret: its approve|reject would be refused"
    )


def approval_health(settings: Settings, workers: WorkersHealth | None) -> Approval:
    view = workers.view if workers is not None else None
    signed = settings.SPILLWAY_APPROVAL_SECRET is not None
    workers_signed = view.policy.approvals_signed if view is not None else None
    return Approval(
        timeout_s=settings.APPROVAL_TIMEOUT_S,
        recheck_s=settings.APPROVAL_RECHECK_S,
        webhook_configured=settings.APPROVAL_WEBHOOK_URL is not None,
        signed=signed,
        workers_signed=workers_signed,
        who_can_approve=who_can_approve(signed, workers_signed),
    )


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


PoolState = Literal["running", "not_started", "closed", "unknown"]


class PoolHealth(BaseModel):
    """The GPU pool's workflow (docs/design.md, "GPU admission"), read off
    DescribeWorkflowExecution, the tail of its history and its `view` query. Jobs start it by
    their first ask, so "not_started" is normal until a job has asked for a GPU place."""

    # running; not_started: no run ever had its id; closed: its latest run ended (`status` says
    # how); unknown: it could not be described, or it is neither running nor closed (paused).
    state: PoolState
    workflow_id: str
    run_id: str | None = None
    status: str | None = None  # the latest run's: RUNNING, TERMINATED, FAILED, TIMED_OUT, ...
    history_length: int | None = None  # events in the current run
    long_history: bool = False  # over LONG_HISTORY events: it is not continuing as new
    # What Temporal told the run at its last workflow task (describe does not carry it).
    continue_as_new_suggested: bool | None = None
    places_in_use: int | None = None  # from the `view` query; None when it did not answer
    line_length: int | None = None
    wedged: WedgedWorkflow | None = None
    error: str | None = None


class Poller(BaseModel):
    identity: str
    kind: str  # "workflow" or "activity" task poller
    last_access: datetime | None


class TemporalHealth(BaseModel):
    address: str
    namespace: str
    reachable: bool
    error: str | None = None
    task_queue: str
    pollers: list[Poller] = []  # workers seen polling the task queue lately
    awaiting_approval: int | None = None
    gpu_pool: PoolHealth | None = None  # None: Temporal not reachable


class BudgetHealth(BaseModel):
    """The budgets and what the spend ledger says is left (None when it could not be read)."""

    daily_usd: float | None
    monthly_usd: float | None
    day: PeriodTotals | None = None
    month: PeriodTotals | None = None
    error: str | None = None
    # Set when what the ledger carries across continue-as-new nears Temporal's payload limit.
    warning: str | None = None
    # Set when the ledger's workflow task fails and is retried (`error` then says so too).
    wedged: WedgedWorkflow | None = None


class WorkersHealth(BaseModel):
    """The workers' own view, or why there is none (no worker answered)."""

    view: WorkersView | None = None
    error: str | None = None


class Health(BaseModel):
    temporal: TemporalHealth
    # What the workers see: their policy and every GPU host's reading through its agent. The
    # fields below it are this shell's own configuration, and its own probe of COMFYUI_URL.
    workers: WorkersHealth | None = None
    trigger: str
    sources: list[Source]
    probe_timeout_s: float
    unreachable_confirm_s: float
    cloud_fallback: CloudFallback
    approval: Approval
    decision: list[str]
    load: LoadStatus
    budget: BudgetHealth | None = None


async def probe_once(settings: Settings) -> LoadStatus:
    reader = NvmlReader()
    try:
        async with httpx.AsyncClient() as http:
            return await LoadStatusActivities(http, settings, reader).probe()
    finally:
        reader.close()


async def temporal_health(settings: Settings) -> TemporalHealth:
    """Connection, the task queue's pollers and the jobs waiting for a person."""
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    from spillway import search_attributes as sa
    from spillway.temporal import TemporalUnreachable, connect, connect_config

    config = connect_config()
    report = TemporalHealth(
        address=config["target_host"],
        namespace=config["namespace"],
        reachable=False,
        task_queue=settings.SPILLWAY_TASK_QUEUE,
    )
    try:
        client = await connect()
    except TemporalUnreachable as exc:
        report.error = str(exc)
        return report
    report.reachable = True
    for kind, queue_type in (
        ("workflow", TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW),
        ("activity", TaskQueueType.TASK_QUEUE_TYPE_ACTIVITY),
    ):
        described = await client.workflow_service.describe_task_queue(
            DescribeTaskQueueRequest(
                namespace=client.namespace,
                task_queue=TaskQueue(name=settings.SPILLWAY_TASK_QUEUE),
                task_queue_type=queue_type,
            )
        )
        report.pollers += [
            Poller(
                identity=p.identity,
                kind=kind,
                last_access=p.last_access_time.ToDatetime(tzinfo=UTC)
                if p.HasField("last_access_time")
                else None,
            )
            for p in described.pollers
        ]
    query = f"WorkflowType = 'VideoJobWorkflow' AND {sa.STATE.name} = 'awaiting_approval'"
    report.awaiting_approval = (await client.count_workflows(query)).count
    report.gpu_pool = await pool_health(client, settings.SPILLWAY_TASK_QUEUE)
    return report


async def workers_health(settings: Settings, timeout_s: float = 20) -> WorkersHealth:
    """Runs SpillwayHealthWorkflow on the workers' task queue."""
    import uuid

    from temporalio.client import WorkflowFailureError
    from temporalio.service import RPCError

    from spillway.temporal import TemporalUnreachable, connect
    from workflows.health import HealthWorkflow

    queue = settings.SPILLWAY_TASK_QUEUE
    try:
        client = await connect()
        view = await client.execute_workflow(
            HealthWorkflow.run,
            id=f"spillway-health-{uuid.uuid4().hex[:12]}",
            task_queue=queue,
            execution_timeout=timedelta(seconds=timeout_s),
        )
    except WorkflowFailureError:
        return WorkersHealth(
            error=f"no worker answered on task queue {queue!r} within {timeout_s:g}s: start one "
            "(spillway worker)"
        )
    except (TemporalUnreachable, RPCError) as exc:
        return WorkersHealth(error=str(exc))
    return WorkersHealth(view=view)


async def budget_health(settings: Settings) -> BudgetHealth:
    from spillway import names
    from spillway.client.budget import ledger_summary
    from spillway.spend_book import CARRY_WARN_BYTES
    from spillway.temporal import TemporalUnreachable, connect

    report = BudgetHealth(
        daily_usd=settings.CLOUD_DAILY_BUDGET_USD, monthly_usd=settings.CLOUD_MONTHLY_BUDGET_USD
    )
    try:
        client = await connect()
        # First: a wedged ledger answers no query either (the summary would only time out).
        ledger_id = names.ledger_id(settings.SPILLWAY_TASK_QUEUE)
        report.wedged = await wedged(client, ledger_id, ledger_remedy(ledger_id))
        if report.wedged is not None:
            report.error = wedged_ledger(report.wedged)
            return report
        summary = await ledger_summary(client, settings)
    except (TemporalUnreachable, Failed) as exc:
        report.error = str(exc)
        return report
    report.day, report.month = summary.day, summary.month
    if summary.closed_as is not None:
        report.warning = (
            f"the spend ledger is closed ({summary.closed_as}): no cloud create is sent until "
            "`spillway ledger restore`"
        )
    carried = summary.carried_bytes
    if report.warning is None and carried is not None and carried >= CARRY_WARN_BYTES:
        report.warning = (
            f"the spend ledger carries {carried // 1024} KiB across continue-as-new "
            "(Temporal refuses payloads over 2 MiB by default): settle or restore what is open"
        )
    return report


# How far back from a history's end the last failed workflow task is looked for (events).
HISTORY_TAIL = 100


def ledger_remedy(ledger_id: str) -> str:
    return (
        f"terminate it (`temporal workflow terminate --workflow-id {ledger_id}`), start the new "
        "workers (spillway worker), then `spillway ledger restore` (its entries come back from "
        "its history)"
    )


def wedged_ledger(found: WedgedWorkflow) -> str:
    """The error `health` reports for a wedged spend ledger."""
    return (
        f"the spend ledger ({found.workflow_id}, run {found.run_id}) is wedged: "
        f"{_failing(found)}; every update answers 'Workflow Task in failed state', so no cloud "
        f"job can run: {found.remedy}"
    )


def _failing(found: WedgedWorkflow) -> str:
    since = found.failing_since
    when = f", failing since {since:%Y-%m-%d %H:%M:%S} UTC" if since is not None else ""
    why = "".join(f": {w}" for w in (found.cause, found.failure) if w)
    return f"its workflow task failed and is being retried (attempt {found.attempt}{when}){why}"


# The pool ends its run after PoolInput.signals_per_run (500) signals or when Temporal suggests
# it (at 4,096 events by default: limit.historyCount.suggestContinueAsNew), whichever comes first,
# once what is under way has ended (a probe takes 10 s at most). A run well past both is not
# continuing as new, and every replay of it grows slower: Temporal warns at 10,240 events and
# terminates the run at 51,200.
LONG_HISTORY = 5_000
# A pool answers its `view` query at once from its book: a longer wait means no worker serves
# its queue, and `health` should not hang on it.
POOL_QUERY_TIMEOUT = timedelta(seconds=5)


def _ask_again() -> str:
    """How long a job in the line waits for an answer before it asks again."""
    from workflows.admission import ASK_AGAIN

    return f"{ASK_AGAIN.total_seconds() / 60:g} minutes"


def pool_remedy(pool_id: str) -> str:
    return (
        f"terminate it (`temporal workflow terminate --workflow-id {pool_id}`): nothing is lost, "
        "its state is only the places and the line; the jobs in its line ask again within "
        f"{_ask_again()} and the next ask starts a fresh pool"
    )


def pool_start_command(task_queue: str) -> str:
    """The `temporal` command that starts the pool before any job asks (an empty PoolInput)."""
    from spillway import names

    return (
        f"temporal workflow start --type {names.GPU_POOL} --task-queue "
        f"{names.pool_queue(task_queue)} --workflow-id {names.pool_id(task_queue)} --input '{{}}'"
    )


async def pool_health(
    client: Client,
    task_queue: str,
    *,
    long_history: int = LONG_HISTORY,
    query_timeout: timedelta = POOL_QUERY_TIMEOUT,
) -> PoolHealth:
    """The GPU pool of `task_queue`: whether it runs, its current run's length, its places and
    line, and whether its workflow task keeps failing; what is wrong, or what Temporal refused or
    did not answer, is in `error`."""
    from temporalio.api.enums.v1 import WorkflowExecutionStatus as Status
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError, RPCStatusCode

    from activities.spend.ledger import RPC_TIMEOUT
    from spillway import names
    from spillway.gpu_pool import PoolView

    pool_id = names.pool_id(task_queue)
    report = PoolHealth(state="unknown", workflow_id=pool_id)
    handle = client.get_workflow_handle(pool_id)
    try:
        described = await handle.describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            report.state = "not_started"
        else:
            report.error = f"the GPU pool ({pool_id}) could not be described: {exc.message}"
        return report
    info = described.raw_description
    run = info.workflow_execution_info
    report.run_id = run.execution.run_id
    report.status = _enum_name(Status, run.status, "WORKFLOW_EXECUTION_STATUS_")
    report.history_length = run.history_length
    report.long_history = run.history_length > long_history
    where = f"the GPU pool ({pool_id}, run {report.run_id})"
    if run.status != Status.WORKFLOW_EXECUTION_STATUS_RUNNING:
        if not run.HasField("close_time"):  # paused, or a status newer than this SDK
            report.error = f"{where} is {report.status}: it answers no job until it runs again"
            return report
        report.state = "closed"
        report.error = (
            f"{where} is closed ({report.status}): nothing is lost, the next job's ask starts a "
            "new pool, which first asks the running jobs which places they hold, but the jobs "
            f"that waited in its line ask again only {_ask_again()} after their last ask (in "
            f"their order); to start it before the next ask: {pool_start_command(task_queue)}"
        )
        return report
    report.state = "running"
    report.wedged = await _wedged_run(client, info, pool_remedy(pool_id))
    if report.wedged is not None:
        # A wedged pool answers no query either (it would only time out).
        report.error = (
            f"{where} is wedged: {_failing(report.wedged)}; it answers no ask, so no job gets "
            f"a GPU place: {report.wedged.remedy}"
        )
        return report
    report.continue_as_new_suggested = await _continue_as_new_suggested(
        client, pool_id, report.run_id
    )
    problems = []
    try:
        view = await handle.query(names.POOL_VIEW, result_type=PoolView, rpc_timeout=query_timeout)
    except (RPCError, WorkflowQueryFailedError) as exc:
        problems.append(
            f"{where} did not answer its query within {query_timeout.total_seconds():g}s "
            f"({exc}): is a worker running (spillway worker)?"
        )
    else:
        report.places_in_use = sum(len(h.places) for h in view.hosts)
        report.line_length = len(view.line)
    if report.long_history:
        suggested = ", though Temporal suggests it" if report.continue_as_new_suggested else ""
        problems.append(
            f"{where} has {run.history_length} events in its current run (over {long_history}): "
            f"it is not continuing as new{suggested}, and Temporal terminates a run at 51,200 "
            f"events; {pool_remedy(pool_id)}"
        )
    report.error = "; ".join(problems) or None
    return report


async def _continue_as_new_suggested(client: Client, workflow_id: str, run_id: str) -> bool | None:
    """What the run's last started workflow task said; None when it is not among the last
    events (a flood of signals since) or they cannot be read."""
    from temporalio.api.enums.v1 import EventType

    for event in await _history_tail(client, workflow_id, run_id):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            return event.workflow_task_started_event_attributes.suggest_continue_as_new
    return None


async def wedged(client: Client, workflow_id: str, remedy: str) -> WedgedWorkflow | None:
    """The workflow, if it runs with a workflow task that failed and is being retried; None when
    it runs normally, is closed or unknown, or cannot be read (the other checks say why)."""
    from temporalio.service import RPCError

    from activities.spend.ledger import RPC_TIMEOUT

    try:
        described = await client.get_workflow_handle(workflow_id).describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError:
        return None
    return await _wedged_run(client, described.raw_description, remedy)


async def _wedged_run(
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

    for event in await _history_tail(client, workflow_id, run_id):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failed = event.workflow_task_failed_event_attributes
            message = failed.failure.message.strip().splitlines()
            cause = _enum_name(WorkflowTaskFailedCause, failed.cause, "WORKFLOW_TASK_FAILED_CAUSE_")
            return cause, message[0][:300] if message else None
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT:
            timeout = event.workflow_task_timed_out_event_attributes.timeout_type
            return "TIMED_OUT", _enum_name(TimeoutType, timeout, "TIMEOUT_TYPE_")
    return None, None


async def _history_tail(client: Client, workflow_id: str, run_id: str) -> list[HistoryEvent]:
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


def _enum_name(enum: Any, value: int, prefix: str) -> str:
    """A protobuf enum value's name without its prefix; the number when this SDK does not know
    it (a newer server)."""
    return enum.Name(value).removeprefix(prefix) if value in enum.values() else str(value)


def health_report(
    settings: Settings, tiers: RoutingTiers, load: LoadStatus, temporal: TemporalHealth
) -> Health:
    providers = [
        ProviderHealth(
            name=p.name,
            tier=tier.tier if (tier := tiers.by_provider(p.name)) else None,
            base_url=shown(p.base_url(settings)),
            key_present=p.keys_present(settings),
        )
        for p in clouds.ordered(settings)
    ]
    first = providers[0]
    return Health(
        temporal=temporal,
        trigger=TRIGGER,
        sources=[
            Source(
                name="comfyui_vram",
                endpoint=shown(settings.comfyui("/system_stats")),
                rule=f"VRAM used >= {settings.A40_VRAM_BUSY_PCT:g}%",
            ),
            Source(
                name="gpu_util_and_queue",
                endpoint=f"NVML GPU {settings.A40_NVML_INDEX} + "
                + shown(settings.comfyui("/queue")),
                rule=f"GPU util >= {settings.A40_UTIL_BUSY_PCT:g}% AND queue_pending >= 1",
            ),
            Source(
                name="a40_guard",
                endpoint=shown(guard) if (guard := settings.guard_status_url()) else None,
                rule="busy == true",
            ),
        ],
        probe_timeout_s=settings.LOAD_PROBE_TIMEOUT_S,
        unreachable_confirm_s=settings.UNREACHABLE_CONFIRM_S,
        cloud_fallback=CloudFallback(
            provider=first.name,
            tier=first.tier,
            base_url=first.base_url,
            fallback_enabled=settings.CLOUD_VIDEO_FALLBACK_ENABLED,
            key_present=first.key_present,
            armed=clouds.armed(settings),
            order=clouds.configured(settings),
            providers=providers,
        ),
        approval=approval_health(settings, None),
        decision=DECISION,
        load=load,
    )
