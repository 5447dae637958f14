"""The spend ledger seen from the activities that spend (docs/design.md, "The spend ledger and the
budget"). `SpendActivities` are what VideoJobWorkflow calls: reserve before any create, settle
after a create that failed, and a read-only view of the budget. `CreateGuard` wraps every
provider's create: armed checked against the worker's settings NOW, `begin` in the ledger right
before the request leaves (only one create per reservation ever begins, whatever resets or
re-runs happened), and the outcome recorded the moment it is known.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from activities.ledger_client import Ledger
from spillway import activity_names as names
from spillway.cloud_models import CreateVerdict, SpendRequest
from spillway.kling_requests import cost_key as kling_cost_key
from spillway.settings import Settings
from spillway.spend_book import SpendRefused, recorded_create
from spillway.spend_models import (
    Authorisation,
    BeginCreate,
    Budgets,
    BudgetView,
    PeriodTotals,
    Reservation,
    ReserveRequest,
    SettleRequest,
    SpendEntry,
    SpendSettle,
)
from spillway.tiers import RoutingTiers
from workflows.spend_ledger import REFUSED

NOT_ARMED = "SpendNotArmed"
WRONG_WORLD = "SpendWrongWorld"


def estimate_usd(tiers: RoutingTiers, settings: Settings, req: SpendRequest) -> float | None:
    """The planning figure of routing_tiers.json for this provider and clip (None: none known)."""
    tier = tiers.by_provider(req.provider)
    if tier is None:
        return None
    if req.provider == "kling" and req.request is not None:
        key = kling_cost_key(req.request, settings.KLING_MODE)
    else:
        key = f"{req.resolution}/{req.duration}s"
    return tier.estimated_cost_usd.get(key)


def budgets_of(settings: Settings) -> Budgets:
    return Budgets(
        daily_usd=settings.CLOUD_DAILY_BUDGET_USD, monthly_usd=settings.CLOUD_MONTHLY_BUDGET_USD
    )


class SpendActivities:
    def __init__(self, ledger: Ledger, settings: Settings, tiers: RoutingTiers) -> None:
        self._ledger, self._settings, self._tiers = ledger, settings, tiers

    @activity.defn(name=names.SPEND_RESERVE)
    async def reserve(self, req: SpendRequest) -> Reservation:
        s = self._settings
        if req.authorisation == "armed" and not s.cloud_armed:
            # The policy in force now, not the one the job read when it started.
            return Reservation(
                refused="the cloud fallback is not armed on the worker any more",
                refused_code="fallback_disarmed",
            )
        if req.provider not in s.cloud_providers:
            return Reservation(
                refused=f"no key for {req.provider} on the worker", refused_code="no_key"
            )
        cost = estimate_usd(self._tiers, s, req)
        try:
            entry = await self._ledger.reserve(
                ReserveRequest(
                    job_id=req.job_id,
                    run_id=activity.info().workflow_run_id or "",
                    provider=req.provider,
                    cost_usd=cost,
                    authorised_by=req.authorised_by,
                    authorisation=req.authorisation,
                    budgets=budgets_of(s),
                )
            )
        except SpendRefused as refused:
            if refused.kind == "exists":
                return Reservation(existing=refused.entry)
            if refused.kind == "budget":
                return Reservation(shortfall=refused.shortfall)
            raise ApplicationError(refused.message, type=REFUSED) from None
        return Reservation(granted=entry)

    @activity.defn(name=names.SPEND_SETTLE)
    async def settle(self, req: SpendSettle) -> SpendEntry | None:
        """After a create that failed without settling (a lost worker): records maybe_charged,
        or released when the create never began. None when the ledger holds nothing for it."""
        try:
            return await self._ledger.settle(
                SettleRequest(
                    job_id=req.job_id,
                    run_id=activity.info().workflow_run_id or "",
                    state=req.state,
                    task_id=req.task_id,
                    note=req.note,
                    cost_usd=req.cost_usd,
                )
            )
        except SpendRefused as refused:
            activity.logger.warning("spend ledger: %s", refused.message)
            return refused.entry

    @activity.defn(name=names.SPEND_RECORDED)
    async def recorded(self, req: SpendRequest) -> SpendEntry | None:
        """The create an earlier run of this job sent (a reset job's): followed, never paid for
        again and never put to a person again."""
        summary = await self._ledger.summary()
        return recorded_create(summary.entries, req.job_id) if summary else None

    @activity.defn(name=names.SPEND_VIEW)
    async def view(self, req: SpendRequest) -> BudgetView:
        """The estimate and what the budgets in force on this worker have left."""
        budgets = budgets_of(self._settings)
        try:
            summary = await self._ledger.summary()
        except RPCError as exc:  # shown to people only: an unknown remainder is no reason to stop
            activity.logger.warning("spend ledger summary: %s", exc.message)
            summary = None

        def left(budget: float | None, used: PeriodTotals | None) -> float | None:
            if budget is None:
                return None
            taken = used.spent_usd + used.reserved_usd if used else 0.0
            return round(max(budget - taken, 0.0), 2)

        return BudgetView(
            estimate_usd=estimate_usd(self._tiers, self._settings, req),
            day_remaining_usd=left(budgets.daily_usd, summary.day if summary else None),
            month_remaining_usd=left(budgets.monthly_usd, summary.month if summary else None),
        )


Send = Callable[[], Awaitable[CreateVerdict]]


@dataclass(frozen=True)
class CreatedOnce:
    verdict: CreateVerdict
    settled: bool  # False: the ledger did not take the outcome; the workflow records it again


class CreateGuard:
    """What every provider's create activity runs its one request inside."""

    def __init__(self, ledger: Ledger, settings: Settings) -> None:
        self._ledger, self._settings = ledger, settings

    async def create(
        self, job_id: str, authorisation: Authorisation, simulated: bool, send: Send
    ) -> CreatedOnce:
        if simulated != self._settings.SPILLWAY_SIMULATED:
            kinds = ("a simulated", "a real") if simulated else ("a real", "a simulated")
            raise ApplicationError(
                f"job {job_id} was decided by {kinds[0]} worker and its create reached "
                f"{kinds[1]} one (do `spillway dev --simulate` and a real worker share a task "
                "queue?): nothing was sent",
                type=WRONG_WORLD,
                non_retryable=True,
            )
        if authorisation == "armed" and not self._settings.cloud_armed:
            raise ApplicationError(
                "the cloud fallback is not armed on this worker any more: nothing was sent",
                type=NOT_ARMED,
                non_retryable=True,
            )
        info = activity.info()
        run_id = info.workflow_run_id or ""
        attempt = f"{run_id}/{info.activity_id}/{info.attempt}"
        try:
            await self._ledger.begin(BeginCreate(job_id=job_id, run_id=run_id, attempt=attempt))
        except SpendRefused as refused:
            raise ApplicationError(
                f"{refused.message}: nothing was sent",
                {"kind": refused.kind, "entry": _dump(refused.entry)},
                type=REFUSED,
                non_retryable=True,
            ) from None
        except ApplicationError as err:
            raise ApplicationError(err.message, type=err.type, non_retryable=True) from None
        verdict = await send()
        state = {"created": "charged", "refused": "released", "ambiguous": "maybe_charged"}
        settle = SettleRequest(
            job_id=job_id,
            run_id=run_id,
            state=state[verdict.outcome],
            task_id=verdict.task_id,
            note=verdict.message[:300],
        )
        try:
            await self._ledger.settle(settle)
            settled = True
        except (SpendRefused, ApplicationError) as exc:
            # The workflow settles again from history; until then the entry blocks any second
            # create for this job, which is the safe side.
            activity.logger.warning("spend ledger: settling job %s failed: %s", job_id, exc)
            settled = False
        return CreatedOnce(verdict=verdict, settled=settled)


def _dump(entry: SpendEntry | None) -> object:
    return entry.model_dump(mode="json") if entry else None
