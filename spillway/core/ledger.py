"""The spend ledger's messages: its entries and budgets, the requests the workers send it
(reserve, begin, settle), what its vet answers, the input a continued ledger carries, and the
views people and jobs read. The rules that judge them are the book's (spend_book.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

SpendState = Literal["reserved", "charged", "maybe_charged", "released", "refused"]
# What a reservation became.
SettleState = Literal["charged", "maybe_charged", "released", "refused"]
ENDED_FREE = ("released", "refused")  # nothing was made: no money, no block on a next provider
# Who allowed the spending: the armed fallback (within the budget), a person (within the
# budget), or a person explicitly over the budget (`spillway approve --over-budget`).
Authorisation = Literal["armed", "approved", "approved_over_budget"]
Period = Literal["day", "month"]
# Every sum of money the ledger takes in or carries. A negative cost erased what a day and a
# month had spent; NaN made every budget comparison false, and once carried (as null) the
# ledger's next run could not read its own input.
Usd = Annotated[float, Field(ge=0, allow_inf_nan=False)]
Seconds = Annotated[float, Field(ge=0, le=7 * 86400, allow_inf_nan=False)]
RECENT_DONE = 20  # create-to-done times per provider the cloud's ETA is the median of


def _without_unset(data: dict[str, Any], *names: str) -> dict[str, Any]:
    """`data` without `names` where they are empty: what a ledger's input was before they
    existed serialises as it did, so a seal made then still checks (ledger_seal.py)."""
    return {k: v for k, v in data.items() if k not in names or v}


class Budgets(BaseModel):
    """The day's and the month's budget the ledger holds; None = no cap of that kind."""

    daily_usd: Usd | None = None
    monthly_usd: Usd | None = None

    def of(self, period: Period) -> float | None:
        return self.daily_usd if period == "day" else self.monthly_usd


class BudgetOrder(BaseModel):
    """New budgets for the ledger, signed with SPILLWAY_LEDGER_SECRET over the ledger's id, the
    budgets, who and when (ledger_seal.py): `spillway budget --day/--month`, or a worker's
    announce at start (`seed`: taken only by a ledger that never had a budget set). Every field
    has a default: what a raw client sends parses, and its missing signature refuses it.
    `team`: the order is that team's budget (`spillway budget --team`, or the teams file's
    `budget` a worker announces), beside the studio's; None: the studio's."""

    ledger_id: str = ""
    budgets: Budgets = Budgets()
    by: Annotated[str, Field(max_length=200)] = ""
    issued_at: datetime | None = None
    seed: bool = False
    signature: Annotated[str, Field(max_length=200)] = ""
    team: Annotated[str, Field(max_length=40)] | None = None

    @model_serializer(mode="wrap")
    def _as_signed(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # A studio order signs the bytes it signed before teams existed.
        return _without_unset(handler(self), "team")


class BudgetSetBy(BaseModel):
    """Who set the budgets in force, with which order, and when the ledger took it."""

    by: str
    issued_at: datetime  # the order's own time: only a newer order replaces it
    at: datetime
    seed: bool = False  # a worker's CLOUD_*_BUDGET_USD, announced at its start


class SpendEntry(BaseModel):
    job_id: str
    run_id: str  # the workflow run that reserved it: a reset or re-run is another run
    # The job's first run id (Temporal's first_execution_run_id): one per use of a job id. None
    # in entries written before 0.4.0, which match any incarnation of their job id.
    incarnation: str | None = None
    provider: str
    cost_usd: Usd | None  # the estimate from routing_tiers.json (None: none known)
    state: SpendState
    task_id: str | None = None
    authorised_by: str  # "armed" or the approver's name
    authorisation: Authorisation
    at: datetime  # reserved at (UTC); it counts in this day's and month's totals
    sent_at: datetime | None = None  # the create request was about to leave (begin)
    sent_by: str | None = None  # which activity attempt began it (run/activity/attempt)
    # sha256 of the nonce that attempt drew (None: begun by a release without tokens).
    token: str | None = None
    # The signed approval it was granted on (spillway.core.approvals.digest) and that signature's
    # end.
    approval: str | None = None
    approval_until: datetime | None = None
    settled_at: datetime | None = None
    note: str = ""
    # From its create being sent to its video being ready, by the job's clock.
    done_s: Seconds | None = None
    # The job's team, as the ledger's vet read it (None: an entry from before teams): its cost
    # counts in that team's budget as well as the studio's.
    team: str | None = None

    @model_serializer(mode="wrap")
    def _as_sealed(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset(handler(self), "done_s", "team")


class ReserveRequest(BaseModel):
    """What a job asks the ledger for. It names no cost and no budget: the ledger reads those
    itself (`Vetted`)."""

    job_id: str
    run_id: str
    provider: str
    authorised_by: str
    authorisation: Authorisation
    # The team the job believes it belongs to (its plan's): the vet reads the team itself and
    # refuses a request that names another (a forged one, or workers reading other teams files).
    team: str | None = None


class Vetted(BaseModel):
    """What the ledger learnt itself about a request (activities/spend/vet.py): whether it comes
    from spillway's own job, and the terms it is judged by."""

    refused: str | None = None  # why the ledger must not take it (then nothing else is set)
    failed: str | None = None  # the vet could not finish: nothing is decided, the caller asks again
    incarnation: str | None = None
    cost_usd: Usd | None = None  # routing_tiers.json's figure for the job's own clip
    # The vetting worker's CLOUD_*_BUDGET_USD: taken only by ledger runs started before the
    # budget became the ledger's own (`BudgetSetBy`); a later run ignores it.
    budgets: Budgets = Budgets()
    # The ledger run that asked, as the activity saw it. Recorded in the ledger's history, so a
    # ledger reset by an operator replays answers naming the run it was reset from.
    ledger_run: str | None = None
    # Another run of the job's incarnation (one it was reset or re-run from) ordered or followed
    # a cloud task, as its history shows: read for every reservation, so a tag the ledger no
    # longer carries never lets a reset create again.
    created_earlier: bool = False
    # False: the ledger run itself is not one spillway made (its input neither continued from a
    # trusted run nor sealed); `refused` says why, and it grants nothing.
    ledger_trusted: bool = True
    # Why `refused`: "foreign" (not spillway's job's own request) or APPROVAL_REFUSED (the
    # approval the request claims is not in the job's history, signed for it).
    refused_kind: str = "foreign"
    # The signed approval the vet found in the job's history for this reservation: its digest
    # and its end (None: armed spending, or workers without SPILLWAY_APPROVAL_SECRET).
    approval: str | None = None
    approval_until: datetime | None = None
    # The job's team: its input's, or the vetting worker's default team (None: a vet from
    # before teams, whose reservations count in the studio's budget only).
    team: str | None = None


class BeginCreate(BaseModel):
    """Sent by the create activity itself just before the request leaves: only the run that
    holds the reservation may send, and only once."""

    job_id: str
    run_id: str
    # The activity attempt that begins (run id / activity id / attempt), as Temporal shows it
    # pending (the vet checks): the same attempt asking again (its first answer was lost) gets
    # its entry back; any other attempt is refused.
    attempt: str = ""
    # sha256 (hex) of a nonce the attempt drew and keeps: what its settle must show.
    token: Annotated[str, Field(max_length=64)] = ""


class SettleRequest(BaseModel):
    job_id: str
    run_id: str
    state: SettleState
    task_id: str | None = None
    note: str = ""
    cost_usd: Usd | None = None  # the provider's own figure replaces the estimate
    # The nonce whose hash the create attempt began with: only that attempt knows it.
    nonce: Annotated[str, Field(max_length=128)] = ""
    done_s: Seconds | None = None  # a charged entry's video is ready, this long after its create


class BudgetShortfall(BaseModel):
    period: Period
    budget_usd: float
    remaining_usd: float
    estimate_usd: float | None
    team: str | None = None  # the team's budget that cannot cover it; None: the studio's

    def budget_name(self) -> str:
        """Which budget: `studio`, or `team:NAME` (a job's reason `budget_exhausted_by=...`)."""
        return "studio" if self.team is None else f"team:{self.team}"

    def text(self) -> str:
        estimate = "unknown" if self.estimate_usd is None else f"${self.estimate_usd:.2f}"
        whose = "" if self.team is None else f"team {self.team}'s "
        return (
            f"the {whose}{'daily' if self.period == 'day' else 'monthly'} cloud budget "
            f"(${self.budget_usd:.2f}) has ${self.remaining_usd:.2f} left; this job's estimate "
            f"is {estimate}"
        )


class PeriodTotals(BaseModel):
    budget_usd: float | None
    spent_usd: float  # charged and maybe_charged: a possible charge counts as spent
    reserved_usd: float  # reservations whose create has not settled yet
    remaining_usd: float | None


class TeamSpend(BaseModel):
    """One team's budget beside the studio's (`spillway budget --team NAME --json`): what its
    jobs spent and reserved, what its own budget has left (null: no budget of its own)."""

    team: str
    day: PeriodTotals
    month: PeriodTotals
    budget_set: BudgetSetBy | None = None


class LedgerSummary(BaseModel):
    """`spillway budget --json` (docs/design.md, "The spend ledger and the budget")."""

    day: PeriodTotals
    month: PeriodTotals
    entries: list[SpendEntry]
    # What its next continue-as-new would carry, against Temporal's payload limit (2 MB by
    # default): `health` warns from CARRY_WARN_BYTES on.
    carried_bytes: int | None = None
    # Set (TERMINATED, FAILED, ...) when the ledger is closed: it sends nothing until restored.
    closed_as: str | None = None
    # Why this ledger run grants nothing: its input is not one spillway made (ledger_seal.py).
    untrusted: str | None = None
    done_s: dict[str, list[float]] = {}  # per provider, its recent create-to-done times
    # Who set `day.budget_usd` and `month.budget_usd` (None: never set, or set by a ledger from
    # before the budget was the ledger's own).
    budget_set: BudgetSetBy | None = None
    # Each team with a budget of its own or spending this month, by name.
    teams: dict[str, TeamSpend] = {}


class IncarnationAsk(BaseModel):
    """The ledger's `created_before` query: did a create of this job incarnation go out before
    the ledger last continued as new?"""

    job_id: str
    incarnation: str | None


class MonthSpend(BaseModel):
    """`spillway budget --month YYYY-MM --json`: the month's spending as the ledger counts it,
    and its entries as the ledger's runs recorded them (those still within the namespace's
    retention: a run older than that is gone, its totals are not)."""

    month: str
    spent_usd: float
    entries: list[SpendEntry]
    runs_read: int


class LedgerInput(BaseModel):
    """Input of SpendLedgerWorkflow. A continued run carries what stays small at any volume: the
    open entries, what the settled ones added to each day and month (`spent`, keyed "YYYY-MM-DD"
    and "YYYY-MM"), and a short tag of every job incarnation whose create went out (`created`,
    by month of its reservation), so that no second create is ever reserved for it. The settled
    entries themselves stay in the history of the run that settled them (`spillway budget
    --month`)."""

    entries: list[SpendEntry] = []
    budgets: Budgets = Budgets()
    spent: dict[str, Usd] = {}
    created: dict[str, str] = {}  # "YYYY-MM" -> space-separated `create_tag`s
    # Digests of signed approvals a create went out under -> when each signature expires: kept
    # only while the signature could still be sent again.
    approvals: dict[str, datetime] = {}
    # Continue as new after this many accepted updates (or when the server suggests it).
    updates_per_run: Annotated[int, Field(ge=1)] = 2000
    # Who made it (spillway/core/ledger_seal.py): set by a continue-as-new, True when the run that
    # continued was trusted; sealed by a worker's first start or `spillway ledger restore`.
    trusted: bool | None = None
    sealed_at: datetime | None = None
    sealed_after: str | None = None  # the ledger's run the sealed one follows (None: the first)
    seal: str | None = None
    # Per provider, its last RECENT_DONE create-to-done times (the cloud's ETA).
    done_s: dict[str, list[float]] = {}
    # Who set `budgets` (None: never set, unless `budgets` holds a cap: a ledger carried from
    # before the budget was the ledger's own, which counts as set).
    budget_set: BudgetSetBy | None = None
    # The teams' own budgets, who set each, and what each team's settled entries added to its
    # days and months (team -> key -> USD, keyed like `spent`).
    team_budgets: dict[str, Budgets] = {}
    team_budget_set: dict[str, BudgetSetBy] = {}
    team_spent: dict[str, dict[str, Usd]] = {}

    @model_serializer(mode="wrap")
    def _as_sealed(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset(
            handler(self), "done_s", "budget_set", "team_budgets", "team_budget_set", "team_spent"
        )


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
    """Input of `spend_settle` (the activity adds the run id; the ledger finds the
    incarnation)."""

    job_id: str
    state: SettleState
    task_id: str | None = None
    note: str = ""
    cost_usd: Usd | None = None
    # A create attempt's nonce it gave up with its provable refusal (its own settle did not
    # reach the ledger): nothing else can free the entry it began.
    nonce: str = ""
    done_s: Seconds | None = None  # its video is ready, this long after its create was sent


class BudgetView(BaseModel):
    """What a waiting job shows about money: its estimate and what the budgets have left."""

    estimate_usd: float | None = None
    day_remaining_usd: float | None = None
    month_remaining_usd: float | None = None
    exhausted: Period | None = None  # set when the budget is why an armed job waits
    # The budgets the remainders are of (None: no cap, or a view of an earlier release), so
    # that a quote can word a shortfall as the ledger's refusal would.
    day_budget_usd: float | None = None
    month_budget_usd: float | None = None
    # False when the ledger's totals could not be read: the remainders are then the whole
    # budgets, and whether they cover the estimate is not known.
    totals_read: bool = True
    # What an approval is for, as the workers read it: the provider the job would be reserved
    # for and the key of its clip's figure in routing_tiers.json (`spillway approve` signs both).
    provider: str | None = None
    cost_key: str | None = None
    # The provider's recent create-to-done times, their median (None: none recorded yet).
    eta_s: float | None = None
    # The job's team and what its own budget has left (None: the team has no budget of its
    # own); `exhausted_team` set when that budget, not the studio's, is why the job waits.
    team: str | None = None
    team_day_remaining_usd: float | None = None
    team_month_remaining_usd: float | None = None
    team_day_budget_usd: float | None = None
    team_month_budget_usd: float | None = None
    exhausted_team: str | None = None
