"""`spillway load` and `spillway health`: the live load status and the whole trigger logic, the way
the original system's /health showed them (docs/design.md, "What spillway is and where it came
from"). Never shows a key, only whether one is present."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING

import httpx
from pydantic import BaseModel

from activities.cloud import registry as clouds
from activities.probe.activities import LoadStatusActivities
from activities.probe.nvml import NvmlReader
from spillway.cli.pool_health import PoolHealth, pool_health
from spillway.cli.wedged import WedgedWorkflow, failing, wedged
from spillway.core.decision import table_rows
from spillway.core.errors import Failed
from spillway.core.ledger import PeriodTotals
from spillway.core.models import LoadStatus, WorkersView
from spillway.core.settings import Settings, shown
from spillway.core.tiers import RoutingTiers

if TYPE_CHECKING:
    pass

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
    recheck_s: float  # APPROVAL_RECHECK_S: only jobs started by 0.4.0 still re-probe by themselves
    pool_reprobe_s: float = 2.0  # SPILLWAY_POOL_REPROBE_S: the GPU pool re-probes for the rest
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
        pool_reprobe_s=settings.SPILLWAY_POOL_REPROBE_S,
        webhook_configured=settings.APPROVAL_WEBHOOK_URL is not None,
        signed=signed,
        workers_signed=workers_signed,
        who_can_approve=who_can_approve(signed, workers_signed),
    )


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
    """The ledger's budgets and what it says is left (None when it could not be read)."""

    daily_usd: float | None
    monthly_usd: float | None
    read: bool = False  # the budgets above are the ledger's (not unknown)
    day: PeriodTotals | None = None
    month: PeriodTotals | None = None
    error: str | None = None
    # Set when what the ledger carries across continue-as-new nears Temporal's payload limit.
    warning: str | None = None
    # Set when the workers that answered hold cloud keys and no SPILLWAY_LEDGER_SECRET: any start
    # of the spend ledger on spillway's queue is believed.
    unsealed: str | None = None
    # Set when the ledger's workflow task fails and is retried (`error` then says so too).
    wedged: WedgedWorkflow | None = None
    # Set when a worker that answered has CLOUD_*_BUDGET_USD other than the ledger's budget.
    worker_settings: str | None = None


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

    from spillway.core import search_attributes as sa
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
    report.gpu_pool = await pool_health(
        client, settings.SPILLWAY_TASK_QUEUE, line_check_s=settings.SPILLWAY_POOL_LINE_CHECK_S
    )
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
    from spillway.client.budget import ledger_summary
    from spillway.core import names
    from spillway.core.spend_book import CARRY_WARN_BYTES
    from spillway.temporal import TemporalUnreachable, connect

    report = BudgetHealth(daily_usd=None, monthly_usd=None)
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
    report.daily_usd, report.monthly_usd = summary.day.budget_usd, summary.month.budget_usd
    report.read = True
    if summary.untrusted is not None:
        report.error = summary.untrusted
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


UNSEALED = (
    "the workers hold cloud keys and no SPILLWAY_LEDGER_SECRET: anyone who may start workflows "
    "can replace the spend ledger with one that forgot the day's spending; set the secret on "
    "every worker (workers of this release do not start without it)"
)


def ledger_seal_health(budget: BudgetHealth | None, workers: WorkersHealth | None) -> None:
    """Notes on `budget` what the workers that answered say about the ledger's seal."""
    policy = workers.view.policy if workers is not None and workers.view is not None else None
    if budget is None or policy is None:
        return
    if policy.key_present and not policy.ledger_sealed:
        budget.unsealed = UNSEALED


def budget_settings_health(budget: BudgetHealth | None, workers: WorkersHealth | None) -> None:
    """Notes on `budget` a worker that answered whose own budget settings are not the ledger's
    budget: they change nothing, and whoever set them may think they do."""
    policy = workers.view.policy if workers is not None and workers.view is not None else None
    if budget is None or policy is None or not policy.budget_read or not budget.read:
        return
    own = (policy.daily_budget_usd, policy.monthly_budget_usd)
    if own == (None, None) or own == (budget.daily_usd, budget.monthly_usd):
        return

    def usd(value: float | None) -> str:
        return "unset" if value is None else f"{value:g}"

    budget.worker_settings = (
        f"worker {policy.worker or '(unnamed)'} has CLOUD_DAILY_BUDGET_USD="
        f"{usd(policy.daily_budget_usd)}, CLOUD_MONTHLY_BUDGET_USD="
        f"{usd(policy.monthly_budget_usd)}; the ledger's budget is {usd(budget.daily_usd)} a "
        f"day, {usd(budget.monthly_usd)} a month: the worker's setting {BUDGET_IS_THE_LEDGERS}"
    )


BUDGET_IS_THE_LEDGERS = "changes nothing: the budget is the ledger's (spillway budget)"


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
        f"{failing(found)}; every update answers 'Workflow Task in failed state', so no cloud "
        f"job can run: {found.remedy}"
    )


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
