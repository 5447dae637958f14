"""The spend ledger's book-keeping as plain code: which reservation may be made, which create may
be sent, how entries settle, and the day's and month's totals. SpendLedgerWorkflow holds one
`SpendBook` and calls it from its update handlers once a request is vetted; being pure (the
caller passes the time), it is deterministic and tested without a Temporal server.

The rules (docs/design.md, money invariants 2, 5 and 6):
- One live entry per job. A job whose earlier create was sent (reserved and begun, charged,
  maybe charged) gets no second reservation, from any run. An entry whose create was provably
  refused (released) lets the job try again (the next provider).
- Only one create per entry ever begins (`begin`, called by the create activity itself right
  before the request leaves). A reservation that has not begun is taken over by whichever run
  reserves or begins next (a reset, a re-run): the old run's create can then no longer begin.
  That is what makes a reset anywhere between reservation and create safe.
- Armed or plainly approved spending must fit in the day's and the month's budget, counting
  what is spent (charged, maybe charged) and what is reserved; only `approved_over_budget`
  goes past it.
- The ledger decides what the book is told: the cost, the budgets and the job's incarnation
  come from `Vetted` (what the ledger read itself off Temporal and the workers' settings),
  never from the request. An entry belongs to one incarnation of a job id (its first run id,
  which survives resets and continue-as-new): a job id used again after its execution is gone
  starts clean and never inherits the old task.
- `released` is only for a create that never began; a begun create the provider provably
  refused is `refused` (nothing made, nothing spent; the next provider may be reserved).
- Settled only by the create attempt that began: the create activity draws a secret nonce and
  begins with its hash (`token`, kept on the entry); freeing a begun entry (`refused`), calling
  it `charged` from `reserved`, or changing its cost takes the nonce, which no one else holds
  until that attempt settles. Without it a request may only say more is spent (`maybe_charged`,
  or `charged` with a task id after `maybe_charged`), never less. The same attempt beginning
  again with another token is refused.
- A signed approval pays for one create: the ledger records a digest of each signature it
  granted a reservation on, and refuses it once a create under it went out (kept until the
  signature expires, across continue-as-new).
"""

from __future__ import annotations

import hashlib
import statistics
from datetime import datetime, timedelta
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
    """CLOUD_DAILY_BUDGET_USD / CLOUD_MONTHLY_BUDGET_USD in force; None = no cap of that kind."""

    daily_usd: Usd | None = None
    monthly_usd: Usd | None = None

    def of(self, period: Period) -> float | None:
        return self.daily_usd if period == "day" else self.monthly_usd


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

    @model_serializer(mode="wrap")
    def _as_sealed(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset(handler(self), "done_s")


class ReserveRequest(BaseModel):
    """What a job asks the ledger for. It names no cost and no budget: the ledger reads those
    itself (`Vetted`)."""

    job_id: str
    run_id: str
    provider: str
    authorised_by: str
    authorisation: Authorisation


class Vetted(BaseModel):
    """What the ledger learnt itself about a request (activities/spend/vet.py): whether it comes
    from spillway's own job, and the terms it is judged by."""

    refused: str | None = None  # why the ledger must not take it (then nothing else is set)
    failed: str | None = None  # the vet could not finish: nothing is decided, the caller asks again
    incarnation: str | None = None
    cost_usd: Usd | None = None  # routing_tiers.json's figure for the job's own clip
    budgets: Budgets = Budgets()  # the workers' CLOUD_*_BUDGET_USD
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
    # What its next continue-as-new would carry, against Temporal's payload limit (2 MB by
    # default): `health` warns from CARRY_WARN_BYTES on.
    carried_bytes: int | None = None
    # Set (TERMINATED, FAILED, ...) when the ledger is closed: it sends nothing until restored.
    closed_as: str | None = None
    # Why this ledger run grants nothing: its input is not one spillway made (ledger_seal.py).
    untrusted: str | None = None
    done_s: dict[str, list[float]] = {}  # per provider, its recent create-to-done times


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

    @model_serializer(mode="wrap")
    def _as_sealed(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        return _without_unset(handler(self), "done_s")


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
    # What an approval is for, as the workers read it: the provider the job would be reserved
    # for and the key of its clip's figure in routing_tiers.json (`spillway approve` signs both).
    provider: str | None = None
    cost_key: str | None = None
    # The provider's recent create-to-done times, their median (None: none recorded yet).
    eta_s: float | None = None


# --- the book ------------------------------------------------------------------------------

CARRY_WARN_BYTES = 512 * 1024  # a quarter of Temporal's default 2 MB payload limit
REFUSED = "SpendRefused"  # ApplicationError type of every refusal; details: kind, entry, ...
APPROVAL_REFUSED = "approval_refused"  # a refusal's kind: the approval does not hold
# A reservation whose create never began (its job was terminated between the two) stops
# counting after this, and its run can no longer begin.
UNSENT_TTL = timedelta(hours=1)
# A job's created tag is carried this long, a day's total for two days, a month's for good. A
# namespace may keep a job, and let it be reset, for longer: past the tag, the vet finds the
# create in the job's earlier runs (`Vetted.created_earlier`).
KEEP = timedelta(days=40)
CENT = 1e-9


class SpendRefused(Exception):
    """A reservation, begin or settle the ledger refuses; `entry` is what stands in the way."""

    def __init__(
        self,
        message: str,
        kind: str,
        entry: SpendEntry | None = None,
        shortfall: BudgetShortfall | None = None,
    ) -> None:
        super().__init__(message)
        self.message, self.kind, self.entry, self.shortfall = message, kind, entry, shortfall


class SpendBook:
    def __init__(
        self,
        entries: list[SpendEntry],
        budgets: Budgets,
        spent: dict[str, float] | None = None,
        created: dict[str, str] | None = None,
        approvals: dict[str, datetime] | None = None,
        done_s: dict[str, list[float]] | None = None,
    ) -> None:
        self.entries = list(entries)
        self.budgets = budgets
        self.spent = dict(spent or {})
        self.created = {month: set(tags.split()) for month, tags in (created or {}).items()}
        self.approvals = dict(approvals or {})
        self.done_s = {provider: list(v) for provider, v in (done_s or {}).items()}

    @classmethod
    def of(cls, inp: LedgerInput) -> SpendBook:
        return cls(inp.entries, inp.budgets, inp.spent, inp.created, inp.approvals, inp.done_s)

    def eta_s(self, provider: str) -> float | None:
        """The cloud's ETA for `provider`: the median of its recent create-to-done times (one
        task stuck for an hour does not make every estimate an hour)."""
        done = self.done_s.get(provider)
        return statistics.median(done) if done else None

    # --- reading -------------------------------------------------------------------------

    def live(self, job_id: str, incarnation: str | None, now: datetime) -> SpendEntry | None:
        """The job's entry that blocks or holds money: not released or refused, not an expired
        unsent reservation."""
        for entry in reversed(self.entries):
            if _mine(entry, job_id, incarnation) and not _over(entry, now):
                return entry
        return None

    def totals(self, period: Period, now: datetime) -> PeriodTotals:
        spent = reserved = 0.0
        for entry in self.entries:
            if not _same(period, entry.at, now) or _over(entry, now):
                continue
            cost = entry.cost_usd or 0.0
            if entry.state == "reserved":
                reserved += cost
            else:
                spent += cost
        spent += self.spent.get(_key(period, now), 0.0)
        budget = self.budgets.of(period)
        # + 0.0: a budget spent to the cent leaves -0.0 after rounding, which prints "$-0.00".
        remaining = None if budget is None else round(budget - spent - reserved, 6) + 0.0
        return PeriodTotals(
            budget_usd=budget,
            spent_usd=round(spent, 6),
            reserved_usd=round(reserved, 6),
            remaining_usd=remaining,
        )

    def summary(self, now: datetime) -> LedgerSummary:
        month = [e for e in self.entries if _same("month", e.at, now)]
        return LedgerSummary(
            day=self.totals("day", now),
            month=self.totals("month", now),
            entries=month,
            done_s=self.done_s,
        )

    def carried(self, now: datetime, updates_per_run: int) -> LedgerInput:
        """What a continued ledger carries (LedgerInput): its size grows with the open entries
        and by one short tag per create, never with the settled entries."""
        spent, kept = dict(self.spent), []
        created = {month: set(tags) for month, tags in self.created.items()}
        approvals = {d: until for d, until in self.approvals.items() if until > now}
        for entry in self.entries:
            until = entry.approval_until
            if entry.approval and until is not None and until > now and has_create(entry):
                approvals[entry.approval] = until
            if entry.state in ("reserved", "maybe_charged"):
                kept.append(entry)
                continue
            cost = 0.0 if entry.state in ENDED_FREE else entry.cost_usd or 0.0
            for key in (_key("day", entry.at), _key("month", entry.at)):
                spent[key] = round(spent.get(key, 0.0) + cost, 6)
            if entry.state == "charged":
                created.setdefault(_key("month", entry.at), set()).add(create_tag(entry))
        yesterday, oldest = _key("day", now - timedelta(days=1)), _key("month", now - KEEP)
        return LedgerInput(
            entries=kept,
            budgets=self.budgets,
            spent={k: v for k, v in spent.items() if len(k) == len("YYYY-MM") or k >= yesterday},
            created={m: " ".join(sorted(t)) for m, t in created.items() if m >= oldest},
            approvals=approvals,
            updates_per_run=updates_per_run,
            done_s=self.done_s,
        )

    def month_spent(self, month: str) -> float:
        held = sum(
            e.cost_usd or 0.0
            for e in self.entries
            if e.state in ("charged", "maybe_charged") and _key("month", e.at) == month
        )
        return round(self.spent.get(month, 0.0) + held, 6)

    def created_before(self, job_id: str, incarnation: str | None) -> bool:
        """Whether a create of this job incarnation went out before the ledger last continued
        as new (its entry is no longer held, its tag is)."""
        tags = {_tag(f"job:{job_id}")} | ({_tag(incarnation)} if incarnation else set())
        return any(tags & month for month in self.created.values())

    # --- reserve --------------------------------------------------------------------------

    def check_reserve(self, req: ReserveRequest, terms: Vetted, now: datetime) -> None:
        current = self.live(req.job_id, terms.incarnation, now)
        if current is not None and has_create(current):
            raise SpendRefused(
                f"job {req.job_id} already has a cloud create: {describe(current)}",
                "exists",
                entry=current,
            )
        if current is None and terms.created_earlier:
            raise SpendRefused(
                f"an earlier run of job {req.job_id} ordered or followed a cloud task (its "
                "history shows it): none is sent again",
                "exists",
            )
        if current is None and self.created_before(req.job_id, terms.incarnation):
            raise SpendRefused(
                f"job {req.job_id} already had a cloud create, recorded before the spend ledger "
                "last continued as new (`spillway budget --month` lists it): none is sent again",
                "exists",
            )
        if current is not None and _same_ask(current, req):
            return  # a retried reservation of the same run gets its entry back
        if terms.approval is not None and self.approval_spent(terms.approval):
            raise SpendRefused(
                f"job {req.job_id}: this signed approval by {req.authorised_by} paid for a create "
                "already; each signature pays for one: approve again",
                APPROVAL_REFUSED,
            )
        if req.authorisation == "approved_over_budget":
            return
        shortfall = self.shortfall(terms.cost_usd, now, excluding=current)
        if shortfall is not None:
            raise SpendRefused(shortfall.text(), "budget", shortfall=shortfall)

    def approval_spent(self, approval: str) -> bool:
        """A create went out under this signature (a reservation that never began spent none)."""
        if approval in self.approvals:
            return True
        return any(e.approval == approval and has_create(e) for e in self.entries)

    def shortfall(
        self, cost_usd: float | None, now: datetime, excluding: SpendEntry | None = None
    ) -> BudgetShortfall | None:
        for period in ("day", "month"):
            totals = self.totals(period, now)
            if totals.budget_usd is None or totals.remaining_usd is None:
                continue
            remaining = totals.remaining_usd
            if excluding is not None and _same(period, excluding.at, now):
                remaining += excluding.cost_usd or 0.0
            if cost_usd is None or cost_usd > remaining + CENT:
                return BudgetShortfall(
                    period=period,
                    budget_usd=totals.budget_usd,
                    remaining_usd=round(max(remaining, 0.0), 2) + 0.0,
                    estimate_usd=cost_usd,
                )
        return None

    def reserve(self, req: ReserveRequest, terms: Vetted, now: datetime) -> SpendEntry:
        self.budgets = terms.budgets
        self.check_reserve(req, terms, now)
        current = self.live(req.job_id, terms.incarnation, now)
        if current is not None and _same_ask(current, req):
            return current
        if current is not None:
            # Taken over from an earlier run (reset, re-run) or an earlier ask: its create can
            # no longer begin.
            current.state, current.settled_at = "released", now
            current.note = f"taken over by run {req.run_id} before its create began"
        entry = SpendEntry(
            job_id=req.job_id,
            run_id=req.run_id,
            incarnation=terms.incarnation,
            provider=req.provider,
            cost_usd=terms.cost_usd,
            state="reserved",
            authorised_by=req.authorised_by,
            authorisation=req.authorisation,
            at=now,
            approval=terms.approval,
            approval_until=terms.approval_until,
        )
        self.entries.append(entry)
        return entry

    # --- begin and settle -----------------------------------------------------------------

    def check_begin(self, req: BeginCreate, terms: Vetted, now: datetime) -> SpendEntry:
        current = self.live(req.job_id, terms.incarnation, now)
        if current is None:
            raise SpendRefused(
                f"job {req.job_id} holds no reservation (expired or never made): nothing was sent",
                "no_reservation",
            )
        if current.sent_at is not None and req.attempt and current.sent_by == req.attempt:
            if (current.token or "") != req.token:
                # Someone who read the attempt off Temporal, not the attempt itself (it keeps
                # its token): nothing more begins.
                raise SpendRefused(
                    f"job {req.job_id}: attempt {req.attempt} began already, with another token",
                    "exists",
                    entry=current,
                )
            return current  # the same attempt asking again: its first answer was lost
        # An unsent reservation of another run is taken over: at most one run of a workflow
        # id is open, and the create that begins first is the only one that may send.
        if current.state != "reserved" or current.sent_at is not None:
            raise SpendRefused(
                f"job {req.job_id} may not create again: {describe(current)}",
                "exists",
                entry=current,
            )
        return current

    def begin(self, req: BeginCreate, terms: Vetted, now: datetime) -> SpendEntry:
        entry = self.check_begin(req, terms, now)
        if entry.sent_at is None:
            entry.run_id, entry.sent_at, entry.sent_by = req.run_id, now, req.attempt
            entry.token = req.token or None
        return entry

    def check_settle(self, req: SettleRequest, terms: Vetted, now: datetime) -> SpendEntry | None:
        """The entry to change; None when it already says so (a retried settle)."""
        mine = [e for e in self.entries if _mine(e, req.job_id, terms.incarnation)]
        entry = next((e for e in reversed(mine) if e.state not in ENDED_FREE), None)
        if entry is None and req.state == "charged" and req.task_id and mine:
            # A task id proves a charge, whatever was recorded before (a refusal settled by
            # someone racing the create): counting it is the safe side. An entry whose attempt
            # settled it with its token hears only that attempt.
            entry = mine[-1] if mine[-1].state == "refused" else None
            if entry is not None and entry.token is not None and _hash(req.nonce) != entry.token:
                raise SpendRefused(
                    f"job {req.job_id}: only the create attempt that began may record "
                    f"charged over {describe(entry)}",
                    "token",
                    entry=entry,
                )
            if entry is not None:
                return entry
        if entry is None:
            if req.state in ENDED_FREE and mine:
                return None  # released or refused already: a retried settle
            raise SpendRefused(f"job {req.job_id} has no open spend entry", "no_reservation")
        same_cost = req.cost_usd is None or req.cost_usd == entry.cost_usd
        proven = entry.token is not None and _hash(req.nonce) == entry.token
        less_spent = req.state in ENDED_FREE or not same_cost
        if entry.token is not None and not proven and less_spent:
            raise SpendRefused(
                f"job {req.job_id}: only the create attempt that began may record {req.state}"
                f"{'' if same_cost else ' or a cost'} over {describe(entry)}",
                "token",
                entry=entry,
            )
        if entry.state == req.state and entry.task_id == (req.task_id or entry.task_id):
            learnt = not same_cost or (req.done_s is not None and entry.done_s is None)
            return entry if learnt else None  # the provider's own cost, its time, learnt later
        own, sent = entry.run_id == req.run_id, entry.sent_at is not None
        allowed = {
            # Only a create that never began gives its money back unasked ...
            ("reserved", "released"): own and not sent,
            # ... and one that began only on the provider's provable "no".
            ("reserved", "refused"): own,
            ("reserved", "charged"): own and sent,
            # Any run of the job may record that a create went out unanswered (or, unsent,
            # never left).
            ("reserved", "maybe_charged"): True,
            ("maybe_charged", "charged"): req.task_id is not None,
            # The attempt's own word: the provider's provable "no" or its task, whatever someone
            # else said before it.
            ("maybe_charged", "refused"): proven,
            ("charged", "refused"): proven,
            ("charged", "charged"): proven,
        }
        if not allowed.get((entry.state, req.state), False):
            raise SpendRefused(
                f"job {req.job_id}: cannot record {req.state} over {describe(entry)}",
                "settled",
                entry=entry,
            )
        if req.state == "charged" and not req.task_id:
            raise SpendRefused("a charged entry needs the task id", "settled", entry=entry)
        return entry

    def settle(self, req: SettleRequest, terms: Vetted, now: datetime) -> SpendEntry:
        entry = self.check_settle(req, terms, now)
        if entry is None:
            return next(
                e for e in reversed(self.entries) if _mine(e, req.job_id, terms.incarnation)
            )
        if entry.token is not None and _hash(req.nonce) == entry.token:
            # Once used, the nonce is in the ledger's history for anyone who can read it.
            entry.token = NONCE_USED
        unsent = entry.state == "reserved" and entry.sent_at is None
        only_done = entry.state == req.state and req.cost_usd in (None, entry.cost_usd)
        entry.state = "released" if unsent else req.state
        entry.settled_at = entry.settled_at if only_done else now
        entry.cost_usd = req.cost_usd if req.cost_usd is not None else entry.cost_usd
        entry.task_id = req.task_id or entry.task_id
        entry.note = (
            "the create never began: nothing was sent" if unsent else req.note or entry.note
        )
        if req.done_s is not None and entry.done_s is None and entry.state == "charged":
            entry.done_s = req.done_s
            done = self.done_s.setdefault(entry.provider, [])
            done.append(req.done_s)
            del done[:-RECENT_DONE]
        return entry


def has_create(entry: SpendEntry) -> bool:
    """A create went out for this entry (or may have): the job never creates again."""
    return entry.state not in ENDED_FREE and not (
        entry.state == "reserved" and entry.sent_at is None
    )


def recorded_create(
    entries: list[SpendEntry], job_id: str, incarnation: str | None
) -> SpendEntry | None:
    return next(
        (e for e in reversed(entries) if _mine(e, job_id, incarnation) and has_create(e)), None
    )


def describe(entry: SpendEntry) -> str:
    task = f" task {entry.task_id}," if entry.task_id else ""
    sent = "" if entry.sent_at is None else f", sent {entry.sent_at:%Y-%m-%d %H:%M:%S} UTC"
    return (
        f"{entry.provider}{task} {entry.state} (run {entry.run_id}, reserved "
        f"{entry.at:%Y-%m-%d %H:%M:%S} UTC{sent})"
    )


def create_tag(entry: SpendEntry) -> str:
    """A short tag of the job incarnation an entry belongs to (its job id for entries older
    than incarnations): ten hex digits, so a million creates cost 11 MB nowhere and 11 bytes
    each in what a continued ledger carries. A collision refuses a create (the safe side)."""
    return _tag(entry.incarnation) if entry.incarnation else _tag(f"job:{entry.job_id}")


# What a begun entry's token becomes once its attempt settled with the nonce: no sha256 hex.
NONCE_USED = "used"


def _hash(nonce: str) -> str:
    return hashlib.sha256(nonce.encode()).hexdigest() if nonce else ""


def token_of(nonce: str) -> str:
    """What a create attempt begins with for the nonce it keeps."""
    return _hash(nonce)


def _tag(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:10]


def _key(period: Period, at: datetime) -> str:
    return f"{at:%Y-%m-%d}" if period == "day" else f"{at:%Y-%m}"


def _mine(entry: SpendEntry, job_id: str, incarnation: str | None) -> bool:
    if entry.job_id != job_id:
        return False
    return entry.incarnation is None or incarnation is None or entry.incarnation == incarnation


def _same_ask(entry: SpendEntry, req: ReserveRequest) -> bool:
    """The same run asking again for the same thing; a run asking under another authorisation
    (an approval after armed spending was refused) is judged anew."""
    return (
        entry.run_id == req.run_id
        and entry.provider == req.provider
        and entry.authorisation == req.authorisation
        and entry.authorised_by == req.authorised_by
    )


def _over(entry: SpendEntry, now: datetime) -> bool:
    if entry.state in ENDED_FREE:
        return True
    return entry.state == "reserved" and entry.sent_at is None and now - entry.at > UNSENT_TTL


def _same(period: Period, at: datetime, now: datetime) -> bool:
    if period == "day":
        return at.date() == now.date()
    return (at.year, at.month) == (now.year, now.month)
