"""The spend ledger's vocabulary (docs/design.md, "The spend ledger and the budget").

Every cloud create is reserved in the ledger first, keyed by job id; the entry then records
what happened to the money: `reserved` → `charged` (a task exists) | `maybe_charged` (the
create was ambiguous) | `released` (the provider provably made nothing).
"""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel

SpendState = Literal["reserved", "charged", "maybe_charged", "released"]
# Who allowed the spending: the armed fallback (within the budget), a person (within the
# budget), or a person explicitly over the budget (`spillway approve --over-budget`).
Authorisation = Literal["armed", "approved", "approved_over_budget"]
Period = Literal["day", "month"]


class Budgets(BaseModel):
    """CLOUD_DAILY_BUDGET_USD / CLOUD_MONTHLY_BUDGET_USD in force; None = no cap of that kind."""

    daily_usd: float | None = None
    monthly_usd: float | None = None

    def of(self, period: Period) -> float | None:
        return self.daily_usd if period == "day" else self.monthly_usd


class SpendEntry(BaseModel):
    job_id: str
    run_id: str  # the workflow run that reserved it: a reset or re-run is another run
    provider: str
    cost_usd: float | None  # the estimate from routing_tiers.json (None: none known)
    state: SpendState
    task_id: str | None = None
    authorised_by: str  # "armed" or the approver's name
    authorisation: Authorisation
    at: datetime  # reserved at (UTC); it counts in this day's and month's totals
    sent_at: datetime | None = None  # the create request was about to leave (begin)
    sent_by: str | None = None  # which activity attempt began it (run/activity/attempt)
    settled_at: datetime | None = None
    note: str = ""


class ReserveRequest(BaseModel):
    job_id: str
    run_id: str
    provider: str
    cost_usd: float | None
    authorised_by: str
    authorisation: Authorisation
    budgets: Budgets  # the budgets in force on the worker that reserves


class BeginCreate(BaseModel):
    """Sent by the create activity itself just before the request leaves: only the run that
    holds the reservation may send, and only once."""

    job_id: str
    run_id: str
    # The activity attempt that begins (run id / activity id / attempt): the same attempt asking
    # again (its first answer was lost) gets its entry back; any other attempt is refused.
    attempt: str = ""


class SettleRequest(BaseModel):
    job_id: str
    run_id: str
    state: Literal["charged", "maybe_charged", "released"]
    task_id: str | None = None
    note: str = ""
    cost_usd: float | None = None  # the provider's own figure replaces the estimate


class BudgetShortfall(BaseModel):
    period: Period
    budget_usd: float
    remaining_usd: float
    estimate_usd: float | None

    def text(self) -> str:
        estimate = "unknown" if self.estimate_usd is None else f"${self.estimate_usd:.2f}"
        return (
            f"the {'daily' if self.period == 'day' else 'monthly'} cloud budget "
            f"(${self.budget_usd:.2f}) has ${self.remaining_usd:.2f} left; this job's estimate "
            f"is {estimate}"
        )


class PeriodTotals(BaseModel):
    budget_usd: float | None
    spent_usd: float  # charged and maybe_charged: a possible charge counts as spent
    reserved_usd: float  # reservations whose create has not settled yet
    remaining_usd: float | None


class LedgerSummary(BaseModel):
    """`spillway budget --json` (docs/design.md, "The spend ledger and the budget")."""

    day: PeriodTotals
    month: PeriodTotals
    entries: list[SpendEntry]


class LedgerInput(BaseModel):
    """Input of SpendLedgerWorkflow; a continued run carries the entries it still needs."""

    entries: list[SpendEntry] = []
    budgets: Budgets = Budgets()
    # Continue as new after this many accepted updates (or when the server suggests it).
    updates_per_run: int = 2000


# --- what the workflow gets back from the `spend_reserve` activity ---------------------------


class Reservation(BaseModel):
    """Exactly one field is set: the reservation (`granted`), the job's earlier create that
    stands in the way (`existing`), the budget that cannot cover it (`shortfall`), or why the
    worker refuses the spending now (`refused`: e.g. the fallback was disarmed)."""

    granted: SpendEntry | None = None
    existing: SpendEntry | None = None
    shortfall: BudgetShortfall | None = None
    refused: str | None = None
    refused_code: str | None = None  # "fallback_disarmed", "no_key"


class SpendSettle(BaseModel):
    """Input of `spend_settle` (the activity adds the run id)."""

    job_id: str
    state: Literal["charged", "maybe_charged", "released"]
    task_id: str | None = None
    note: str = ""
    cost_usd: float | None = None


class BudgetView(BaseModel):
    """What a waiting job shows about money: its estimate and what the budgets have left."""

    estimate_usd: float | None = None
    day_remaining_usd: float | None = None
    month_remaining_usd: float | None = None
    exhausted: Period | None = None  # set when the budget is why an armed job waits
