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
- Armed or plainly approved spending must fit in the studio's day and month budget and in its
  team's (spend_budgets.py), counting what is spent (charged, maybe charged) and what is
  reserved; only `approved_over_budget` goes past them. Each entry carries its team, so one
  book holds the studio's totals and every team's at once.
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
- The budgets are the book's own, set in one place: a signed order (`spillway budget [--team]`,
  checked by the vet) or a worker's seed, by spend_budgets.py's rule (a book carried with a
  studio cap from before counts as set). Nothing else changes them: not a request, not a
  worker's settings.
- A signed approval pays for one create: the ledger records a digest of each signature it
  granted a reservation on, and refuses it once a create under it went out (kept until the
  signature expires, across continue-as-new).
"""

from __future__ import annotations

import hashlib
import statistics
from collections.abc import Iterator
from datetime import datetime, timedelta

from spillway.core.ledger import (
    ENDED_FREE,
    RECENT_DONE,
    BeginCreate,
    BudgetOrder,
    Budgets,
    BudgetSetBy,
    BudgetShortfall,
    LedgerInput,
    LedgerSummary,
    Period,
    PeriodTotals,
    ReserveRequest,
    SettleRequest,
    SpendEntry,
    TeamSpend,
    Vetted,
)
from spillway.core.spend_budgets import Left, OrderNotTaken, first_short, set_by, takes

CARRY_WARN_BYTES = 512 * 1024  # a quarter of Temporal's default 2 MB payload limit
REFUSED = "SpendRefused"  # ApplicationError type of every refusal; details: kind, entry, ...
APPROVAL_REFUSED = "approval_refused"  # a refusal's kind: the approval does not hold
BUDGET_ORDER_REFUSED = "budget_order"  # a refusal's kind: a budget order changes nothing
# A reservation whose create never began (its job was terminated between the two) stops
# counting after this, and its run can no longer begin.
UNSENT_TTL = timedelta(hours=1)
# A job's created tag is carried this long, a day's total for two days, a month's for good. A
# namespace may keep a job, and let it be reset, for longer: past the tag, the vet finds the
# create in the job's earlier runs (`Vetted.created_earlier`).
KEEP = timedelta(days=40)


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
        budget_set: BudgetSetBy | None = None,
        team_budgets: dict[str, Budgets] | None = None,
        team_budget_set: dict[str, BudgetSetBy] | None = None,
        team_spent: dict[str, dict[str, float]] | None = None,
    ) -> None:
        self.entries = list(entries)
        self.budgets = budgets
        self.budget_set = budget_set
        self.team_budgets = dict(team_budgets or {})
        self.team_budget_set = dict(team_budget_set or {})
        self.team_spent = {team: dict(keys) for team, keys in (team_spent or {}).items()}
        self.spent = dict(spent or {})
        self.created = {month: set(tags.split()) for month, tags in (created or {}).items()}
        self.approvals = dict(approvals or {})
        self.done_s = {provider: list(v) for provider, v in (done_s or {}).items()}

    @classmethod
    def of(cls, inp: LedgerInput) -> SpendBook:
        return cls(
            inp.entries,
            inp.budgets,
            inp.spent,
            inp.created,
            inp.approvals,
            inp.done_s,
            inp.budget_set,
            inp.team_budgets,
            inp.team_budget_set,
            inp.team_spent,
        )

    # --- the budgets ---------------------------------------------------------------------

    def budget_is_set(self, team: str | None = None) -> bool:
        """Set by an order or a seed, or (the studio's) carried with a cap from a ledger of
        before."""
        if team is not None:
            return team in self.team_budget_set
        return self.budget_set is not None or self.budgets != Budgets()

    def budgets_of(self, team: str | None) -> Budgets:
        """The studio's budgets (None), or a team's own (none set: no cap of its own)."""
        return self.budgets if team is None else self.team_budgets.get(team, Budgets())

    def set_budgets(self, order: BudgetOrder, now: datetime) -> Budgets:
        """Takes a signed order (the vet checked its signature) for the budget it names, the
        studio's or a team's. Returns that budget in force."""
        team = order.team
        held = self.budget_set if team is None else self.team_budget_set.get(team)
        try:
            taken = takes(order, held, self.budget_is_set(team))
        except OrderNotTaken as refused:
            raise SpendRefused(str(refused), BUDGET_ORDER_REFUSED) from None
        if taken and team is None:
            self.budgets, self.budget_set = order.budgets.model_copy(), set_by(order, now)
        elif taken and team is not None:
            self.team_budgets[team] = order.budgets.model_copy()
            self.team_budget_set[team] = set_by(order, now)
        return self.budgets_of(team)

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

    def totals(self, period: Period, now: datetime, team: str | None = None) -> PeriodTotals:
        """The studio's totals (`team` None: every entry, every budget), or one team's (its
        entries, its own budget)."""
        spent = reserved = 0.0
        for entry in self.entries:
            if not _same(period, entry.at, now) or _over(entry, now):
                continue
            if team is not None and entry.team != team:
                continue
            cost = entry.cost_usd or 0.0
            if entry.state == "reserved":
                reserved += cost
            else:
                spent += cost
        settled = self.spent if team is None else self.team_spent.get(team, {})
        spent += settled.get(_key(period, now), 0.0)
        budget = self.budgets_of(team).of(period)
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
            budget_set=self.budget_set,
            teams={team: self.team_view(team, now) for team in self.teams(now)},
        )

    def team_view(self, team: str, now: datetime) -> TeamSpend:
        return TeamSpend(
            team=team,
            day=self.totals("day", now, team),
            month=self.totals("month", now, team),
            budget_set=self.team_budget_set.get(team),
        )

    def teams(self, now: datetime) -> list[str]:
        """The teams with a budget of their own, or spending this month."""
        month = _key("month", now)
        named = set(self.team_budgets) | set(self.team_budget_set)
        named |= {team for team, keys in self.team_spent.items() if month in keys}
        named |= {e.team for e in self.entries if e.team is not None and _same("month", e.at, now)}
        return sorted(named)

    def carried(self, now: datetime, updates_per_run: int) -> LedgerInput:
        """What a continued ledger carries (LedgerInput): its size grows with the open entries
        and by one short tag per create, never with the settled entries."""
        spent, kept = dict(self.spent), []
        team_spent = {team: dict(keys) for team, keys in self.team_spent.items()}
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
                if entry.team is not None:
                    mine = team_spent.setdefault(entry.team, {})
                    mine[key] = round(mine.get(key, 0.0) + cost, 6)
            if entry.state == "charged":
                created.setdefault(_key("month", entry.at), set()).add(create_tag(entry))
        yesterday, oldest = _key("day", now - timedelta(days=1)), _key("month", now - KEEP)

        def recent(keys: dict[str, float]) -> dict[str, float]:
            return {k: v for k, v in keys.items() if len(k) == len("YYYY-MM") or k >= yesterday}

        def team_recent(keys: dict[str, float]) -> dict[str, float]:
            # A team's budget is for this day and month only: up to a hundred teams' past
            # months would grow what is carried for ever.
            return {k: v for k, v in recent(keys).items() if k >= oldest}

        return LedgerInput(
            entries=kept,
            budgets=self.budgets,
            spent=recent(spent),
            created={m: " ".join(sorted(t)) for m, t in created.items() if m >= oldest},
            approvals=approvals,
            updates_per_run=updates_per_run,
            done_s=self.done_s,
            budget_set=self.budget_set,
            team_budgets=self.team_budgets,
            team_budget_set=self.team_budget_set,
            team_spent={
                team: kept_keys
                for team, keys in team_spent.items()
                if (kept_keys := team_recent(keys))
            },
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
        shortfall = self.shortfall(terms.cost_usd, now, excluding=current, team=terms.team)
        if shortfall is not None:
            raise SpendRefused(shortfall.text(), "budget", shortfall=shortfall)

    def approval_spent(self, approval: str) -> bool:
        """A create went out under this signature (a reservation that never began spent none)."""
        if approval in self.approvals:
            return True
        return any(e.approval == approval and has_create(e) for e in self.entries)

    def shortfall(
        self,
        cost_usd: float | None,
        now: datetime,
        excluding: SpendEntry | None = None,
        team: str | None = None,
    ) -> BudgetShortfall | None:
        """The budget that cannot cover `cost_usd` for a job of `team`: the studio's, then the
        team's own; `excluding`: a reservation the new one takes over, whose cost counts back."""
        return first_short(cost_usd, self._left(now, excluding, team))

    def _left(
        self, now: datetime, excluding: SpendEntry | None, team: str | None
    ) -> Iterator[Left]:
        for whose in (None, team) if team is not None else (None,):
            for period in ("day", "month"):
                totals = self.totals(period, now, whose)
                if totals.budget_usd is None or totals.remaining_usd is None:
                    continue
                remaining = totals.remaining_usd
                counted = excluding is not None and (whose is None or excluding.team == whose)
                if counted and excluding is not None and _same(period, excluding.at, now):
                    remaining += excluding.cost_usd or 0.0
                yield Left(period, totals.budget_usd, remaining, whose)

    def reserve(self, req: ReserveRequest, terms: Vetted, now: datetime) -> SpendEntry:
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
            team=terms.team,
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
            # Released or refused already, so nothing of it is spent: a retried settle (its
            # first answer lost with its worker), or a job that lost its create's worker and
            # says "maybe" where the ledger knows. Either hears the entry as it is: told "no
            # entry", a job would say a charge may exist that the ledger rightly never counts.
            if mine and req.state in (*ENDED_FREE, "maybe_charged"):
                return None
            if req.state == "maybe_charged" and not self.created_before(
                req.job_id, terms.incarnation
            ):
                # Its release left at a continue-as-new (a begun entry is always carried, a
                # charged one leaves its tag): no create of this job ever began.
                raise SpendRefused(
                    f"job {req.job_id} has no open spend entry: no create of it began",
                    "no_reservation",
                    entry=_never_began(req, terms, now),
                )
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


def _never_began(req: SettleRequest, terms: Vetted, now: datetime) -> SpendEntry:
    """What the book says of a job it holds nothing of: a reservation released unsent."""
    return SpendEntry(
        job_id=req.job_id,
        run_id=req.run_id,
        incarnation=terms.incarnation,
        provider="",
        cost_usd=None,
        state="released",
        authorised_by="",
        authorisation="armed",
        at=now,
        settled_at=now,
        note="the spend ledger holds no create of this job: none began",
    )


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
