"""The spend ledger seen from the workflow (docs/design.md, "The spend ledger and the budget"):
`SpendActivities` reserve before any create, settle after a create that failed, and read the
budget for a person who is asked. The create itself runs inside guard.py's `CreateGuard`; the
ledger is reached through ledger.py.
"""

from __future__ import annotations

import statistics

from pydantic import BaseModel
from temporalio import activity
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError

from activities.cloud import registry
from activities.spend.ledger import Ledger
from activities.spend.vet import estimate_usd
from spillway.core import names
from spillway.core.ledger import (
    Authorisation,
    BudgetView,
    PeriodTotals,
    Reservation,
    ReserveRequest,
    SettleRequest,
    SpendEntry,
    SpendSettle,
)
from spillway.core.models import CloudRequest
from spillway.core.settings import Settings
from spillway.core.spend_book import APPROVAL_REFUSED, REFUSED, SpendRefused, recorded_create
from spillway.core.tiers import RoutingTiers


class SpendRequest(BaseModel):
    """Input of `spend_reserve` and the ledger's reads (the activity adds the run id; the ledger
    finds the estimate, the budgets and the job's incarnation itself)."""

    job_id: str
    provider: str
    request: CloudRequest
    authorised_by: str
    authorisation: Authorisation
    team: str | None = None  # the job's plan's team (None: a job from before teams)


class SpendActivities:
    def __init__(self, ledger: Ledger, settings: Settings, tiers: RoutingTiers) -> None:
        self._ledger, self._settings, self._tiers = ledger, settings, tiers

    @activity.defn(name=names.SPEND_RESERVE)
    async def reserve(self, req: SpendRequest) -> Reservation:
        s = self._settings
        if req.authorisation == "armed" and not registry.armed(s):
            # The policy in force now, not the one the job read when it started.
            return Reservation(
                refused="the cloud fallback is not armed on the worker any more",
                refused_code="fallback_disarmed",
            )
        if req.provider not in registry.configured(s):
            return Reservation(
                refused=f"no key for {req.provider} on the worker", refused_code="no_key"
            )
        try:
            entry = await self._ledger.reserve(
                ReserveRequest(
                    job_id=req.job_id,
                    run_id=activity.info().workflow_run_id or "",
                    provider=req.provider,
                    authorised_by=req.authorised_by,
                    authorisation=req.authorisation,
                    team=req.team,
                )
            )
        except SpendRefused as refused:
            if refused.kind == "exists" and refused.entry is None:
                # A create went out whose entry the ledger no longer holds: its task is followed
                # from the ledger's history, and without it nothing is sent.
                found = await self._archived(req.job_id)
                if found is None:
                    # Its kind stays in the job's history: a reset of this run is refused too.
                    raise ApplicationError(
                        refused.message, {"kind": "exists"}, type=REFUSED, non_retryable=True
                    ) from None
                return Reservation(existing=found)
            if refused.kind == "exists":
                return Reservation(existing=refused.entry)
            if refused.kind == "budget":
                return Reservation(shortfall=refused.shortfall)
            if refused.kind == APPROVAL_REFUSED:
                # The person is told and may decide again; the job waits on.
                return Reservation(refused=refused.message, refused_code=APPROVAL_REFUSED)
            # The ledger's "no" (not spillway's request, a reset ledger): asking again changes
            # nothing, and the job fails saying why.
            raise ApplicationError(refused.message, type=REFUSED, non_retryable=True) from None
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
                    nonce=req.nonce,
                    done_s=req.done_s,
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
        if summary is None:
            return None
        info = activity.info()
        incarnation = await self._ledger.incarnation(info.workflow_id or "", info.workflow_run_id)
        held = recorded_create(summary.entries, req.job_id, incarnation)
        if held is None and await self._ledger.created_before(req.job_id, incarnation):
            return await self._archived(req.job_id)
        return held

    async def _archived(self, job_id: str) -> SpendEntry | None:
        """The create of the asking job's incarnation that the ledger settled before it last
        continued as new, read from the history of the run that settled it."""
        info = activity.info()
        incarnation = await self._ledger.incarnation(info.workflow_id or "", info.workflow_run_id)
        return await self._ledger.archived_create(job_id, incarnation)

    @activity.defn(name=names.SPEND_VIEW)
    async def view(self, req: SpendRequest) -> BudgetView:
        """The estimate and what the ledger's budgets have left (not this worker's settings:
        the budget is the ledger's)."""
        try:
            summary = await self._ledger.summary()
        except RPCError as exc:  # shown to people only: an unknown remainder is no reason to stop
            activity.logger.warning("spend ledger summary: %s", exc.message)
            summary = None

        def left(totals: PeriodTotals | None) -> float | None:
            if totals is None or totals.remaining_usd is None:
                return None
            return round(max(totals.remaining_usd, 0.0), 2)

        team = summary.teams.get(req.team) if summary and req.team else None
        return BudgetView(
            estimate_usd=estimate_usd(self._tiers, self._settings, req.provider, req.request),
            day_remaining_usd=left(summary.day if summary else None),
            month_remaining_usd=left(summary.month if summary else None),
            day_budget_usd=summary.day.budget_usd if summary else None,
            month_budget_usd=summary.month.budget_usd if summary else None,
            totals_read=summary is not None,
            provider=req.provider or None,
            cost_key=registry.cost_key(req.provider, req.request, self._settings) or None,
            eta_s=_median(summary.done_s.get(req.provider)) if summary else None,
            team=req.team,
            team_day_remaining_usd=left(team.day if team else None),
            team_month_remaining_usd=left(team.month if team else None),
            team_day_budget_usd=team.day.budget_usd if team else None,
            team_month_budget_usd=team.month.budget_usd if team else None,
        )


def _median(done: list[float] | None) -> float | None:
    return round(statistics.median(done), 1) if done else None
