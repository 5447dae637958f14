"""The routing decision (docs/design.md, "The decision") as a pure function: no I/O, no clock, no
randomness, so the workflow can call it and replay it. `TABLE` is the one written form of the
decision: `spillway health` prints it, a test checks that the README shows the same rows, and
the table-driven test pins `decide` to it row by row.

"Armed" is `is_armed` and nothing else. The budget is the one part of "armed" that is not
known here: the spend ledger checks it when the cost is reserved, and an armed job it cannot
cover waits for a person (`budget_exhausted`), like an unarmed one.

`route` is the decision as a job and a quote both take it (docs/design.md, "The decision" and
"GPU admission"): from what the caller measured and read (the load, armed, the GPU pool's
answer, the patience, the budget figures or the ledger's refusal) it gives the route and the
why that `spillway quote`, a job's `plan.quote` and `spillway status` show. A quote that read
the budget and a job the ledger refused therefore say the same thing: `budget_exhausted`.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from spillway.core.ledger import Authorisation, BudgetShortfall, BudgetView, Period
from spillway.core.models import LoadStatus, LocalQuote, VideoJob
from spillway.core.spend_budgets import Left, first_short

Route = Literal["local", "cloud", "await"]
QuoteRoute = Literal["local", "cloud", "await_approval"]


@dataclass(frozen=True)
class Row:
    reachable: bool
    overloaded: bool | None  # None: any (not measured when ComfyUI is unreachable)
    armed: bool | None  # None: any
    route: Route
    says: str  # the route column as people read it


TABLE = (
    Row(True, False, None, "local", "LOCAL: submit to ComfyUI"),
    Row(True, True, True, "cloud", "CLOUD: MiniMax (tier 5)"),
    Row(True, True, False, "await", "AWAIT approval"),
    Row(False, None, True, "cloud", "CLOUD"),
    Row(False, None, False, "await", "AWAIT approval; without one, wait for ComfyUI to come back"),
)


def is_armed(fallback_enabled: bool, key_present: bool, has_cloud_request: bool) -> bool:
    """CLOUD_VIDEO_FALLBACK_ENABLED=1 AND a provider key on the worker AND a cloud request in the
    job (the budget is the ledger's to check)."""
    return fallback_enabled and key_present and has_cloud_request


def table_rows() -> list[tuple[str, str, str, str]]:
    """The table as the README and `spillway health` write it: yes / no / a dash / any."""

    def cell(value: bool | None, unset: str) -> str:
        return unset if value is None else ("yes" if value else "no")

    return [
        (cell(r.reachable, "any"), cell(r.overloaded, "\N{EN DASH}"), cell(r.armed, "any"), r.says)
        for r in TABLE
    ]


class Decision(BaseModel):
    route: Route
    trigger: Literal["overloaded", "unreachable"] | None
    reasons: list[str]
    why: str


def patience_s(job: VideoJob, overflow_after_s: float, now: datetime) -> float | None:
    """How long an armed job may wait in the GPU line before the cloud: its own `max_wait_s`, the
    time to its `deadline`, else the workers' CLOUD_OVERFLOW_AFTER_S; None (or 0): overflow as
    soon as the places are full."""
    if job.max_wait_s is not None:
        return job.max_wait_s or None
    if job.deadline is not None:
        return max((job.deadline - now).total_seconds(), 0.0)
    return overflow_after_s or None


def places_taken(load: LoadStatus, full: list[str]) -> LoadStatus:
    """The reading as the decision sees it once the GPU pool said every place that the job could
    take is taken (docs/design.md, "GPU admission"): overloaded, the pool's reasons added
    (`gpu_places_full_<host>_<n>of<max>`)."""
    if not load.reachable or load.overloaded:
        return load
    return load.model_copy(update={"overloaded": True, "reasons": [*load.reasons, *full]})


def decide(load: LoadStatus, armed: bool, has_cloud: bool = True) -> Decision:
    """`reachable=False` must already be confirmed by a second probe. A job without a cloud
    request has nobody to ask: its why says what it waits for."""
    if load.reachable and not load.overloaded:
        return Decision(route="local", trigger=None, reasons=[], why="a GPU host has headroom")
    trigger: Literal["overloaded", "unreachable"] = (
        "overloaded" if load.reachable else "unreachable"
    )
    if armed:
        return Decision(
            route="cloud",
            trigger=trigger,
            reasons=load.reasons,
            why=f"the GPU hosts are {trigger} and the cloud fallback is armed",
        )
    if not has_cloud:
        waits = "a GPU place" if load.reachable else "a GPU host to answer"
        why = f"the GPU hosts are {trigger} and the job asks for no cloud: it waits for {waits}"
    else:
        why = f"the GPU hosts are {trigger} and the cloud fallback is not armed: a person decides"
    return Decision(route="await", trigger=trigger, reasons=load.reasons, why=why)


# --- the route and its why, for a job and a quote alike ------------------------------------

DRAINED = "gpu_host_drained_"  # the GPU pool's reason for a host drained by a person
BUDGET_EXHAUSTED = "budget_exhausted"
OVER_BUDGET_BY_A_PERSON = (
    "only a person can send it past the budget, per job: "
    "`spillway approve JOB --by NAME --over-budget`"
)


class Line(BaseModel):
    """Where the GPU pool put a job's ask, or would put it (a quote): a place on `host` now, or
    `position` in the line (its estimated start `eta_s`, None: no renders seen); `full` names
    each host whose places are taken or that is drained (`gpu_host_drained_<host>`)."""

    host: str | None = None
    position: int = 0
    eta_s: float | None = None
    render_s: float | None = None  # a typical render here
    full: list[str] = []

    @property
    def drained(self) -> list[str]:
        return [r.removeprefix(DRAINED) for r in self.full if r.startswith(DRAINED)]


@dataclass(frozen=True)
class Seen:
    """What the caller measured and read for `route`; the function reads nothing else, not
    even a clock. `line` None: the pool was not asked (yet). `budget` None: not read (the
    ledger checks when it reserves). `shortfall`: the ledger refused the reservation.
    `approval`: how the job was sent to the cloud, when it was (a person's approval, or armed:
    its host lost, its patience over); None while it is being decided."""

    load: LoadStatus
    armed: bool
    has_cloud: bool
    hosts: tuple[str, ...] = ()
    unfit: tuple[str, ...] = ()  # hosts that cannot run the job's graph
    line: Line | None = None
    patience_s: float | None = None  # `patience_s` of an armed job, None without one
    by_deadline: bool = False  # the patience runs to a deadline: a render's time is kept
    budget: BudgetView | None = None
    shortfall: BudgetShortfall | None = None
    approval: Authorisation | None = None

    def refused(self, shortfall: BudgetShortfall) -> Seen:
        return replace(self, shortfall=shortfall)


class Verdict(BaseModel):
    """`decision` as the job acts on it (its route, trigger and reasons); `quote` and `why` as
    a quote, the job's `plan.quote` and `spillway status` say it; `patient`: an armed job that
    waits in line by its patience (`patience_s` of it left once a render's time is kept)."""

    decision: Decision
    quote: QuoteRoute
    why: str
    local: LocalQuote
    patient: bool = False
    patience_s: float | None = None
    shortfall: BudgetShortfall | None = None

    @property
    def route(self) -> Route:
        return self.decision.route


def route(seen: Seen) -> Verdict:
    """The decision table, the GPU pool's answer, the patience and the budget, in that order:
    a place now runs here; a probe that says overloaded (or unreachable) sends an armed job to
    the cloud at once; full places send it there unless its patience covers the line's
    estimate; the cloud needs the budget to cover the estimate, else the job waits for a
    person (`budget_exhausted`, naming the budget) exactly as the ledger's refusal would say."""
    line = seen.line
    fit = [h for h in seen.hosts if h not in seen.unfit]
    local = LocalQuote(
        hosts=fit,
        position=line.position if line is not None else 0,
        eta_s=line.eta_s if line is not None else None,
    )
    probed = decide(seen.load, seen.armed, seen.has_cloud)
    decision, patient, patience = probed, False, None
    # Sent to the cloud already (a person's approval; armed, its host lost or its patience
    # over): neither a place nor the patience counts any more, only the budget.
    sent = seen.approval is not None and seen.has_cloud
    # An armed job the probe finds overloaded or unreachable never asks the pool: the line
    # matters only to the others.
    if probed.route != "cloud" and line is not None:
        if line.host is not None and not sent:
            placed = probed.model_copy(update={"route": "local"})
            why = _placed(line.host, probed) + _hosts_note(seen)
            return Verdict(decision=placed, quote="local", why=why, local=local)
        if line.host is None:
            decision = decide(places_taken(seen.load, line.full), seen.armed, seen.has_cloud)
            if seen.armed and seen.patience_s is not None and not sent:
                patience = seen.patience_s
                if seen.by_deadline:
                    patience = max(patience - (line.render_s or 0.0), 0.0)
                # No render seen yet (a new pool): it waits, and its patience ends the wait;
                # an estimate nobody has never spends.
                patient = line.eta_s <= patience if line.eta_s is not None else patience > 0
    shortfall = None
    if sent:
        decision = decision.model_copy(update={"route": "cloud"})
    if decision.route == "cloud" and not patient:
        shortfall = _short(seen)
        if shortfall is not None:
            decision = decision.model_copy(update={"route": "await"})
    verdict = Verdict(
        decision=decision,
        quote=_quote_route(decision.route, patient, seen.has_cloud),
        why="",
        local=local,
        patient=patient,
        patience_s=patience,
        shortfall=shortfall,
    )
    return verdict.model_copy(update={"why": _why(seen, verdict)})


def _short(seen: Seen) -> BudgetShortfall | None:
    """The ledger's refusal, or what it would say of the figures read (None: it covers the
    estimate, the figures are not known, or a person approved past the budget)."""
    if seen.approval == "approved_over_budget":
        return None
    if seen.shortfall is not None:
        return seen.shortfall
    view = seen.budget
    if view is None or not view.totals_read:
        return None
    team = view.team
    periods: tuple[tuple[str | None, Period, float | None, float | None], ...] = (
        (None, "day", view.day_budget_usd, view.day_remaining_usd),
        (None, "month", view.month_budget_usd, view.month_remaining_usd),
        (team, "day", view.team_day_budget_usd, view.team_day_remaining_usd),
        (team, "month", view.team_month_budget_usd, view.team_month_remaining_usd),
    )
    return first_short(
        view.estimate_usd,
        (
            Left(period, budget if budget is not None else left, left, whose)
            for whose, period, budget, left in periods
            if left is not None
        ),
    )


def _quote_route(route: Route, patient: bool, has_cloud: bool) -> QuoteRoute:
    """A job waiting by its patience waits in line; one that may not spend waits in line for a
    place, or with a cloud prompt also for a person."""
    if patient or route == "local" or (route == "await" and not has_cloud):
        return "local"
    return "cloud" if route == "cloud" else "await_approval"


def _placed(host: str, probed: Decision) -> str:
    why = f" ({probed.why})" if probed.route == "local" else ""
    return f"a place on {host} now{why}"


def _why(seen: Seen, verdict: Verdict) -> str:
    decision, local, line = verdict.decision, verdict.local, seen.line
    hosts = _hosts_note(seen)
    if line is None:
        waits = ""
    else:
        waits = f"{ordinal(local.position)} in line for the GPUs{about(local.eta_s)}"
    if verdict.quote == "local":
        if verdict.patient and verdict.patience_s is not None:
            return (
                f"{waits}; it runs locally when a place frees, within its patience of "
                f"{duration(verdict.patience_s)} ({decision.why}){hosts}"
            )
        if not waits:
            return f"{decision.why}{hosts}"
        return f"{waits}; it runs locally when a place frees ({decision.why}){hosts}"
    if verdict.shortfall is not None:
        short = verdict.shortfall
        in_line = f"; meanwhile {waits}" if waits else ""
        gpus = f" (the GPU hosts are {decision.trigger})" if decision.trigger else ""
        return (
            f"{BUDGET_EXHAUSTED} ({short.period}): {short.text()}{gpus}. It would wait for a "
            f"person: {OVER_BUDGET_BY_A_PERSON}{in_line}{hosts}"
        )
    if verdict.quote == "await_approval":
        in_line = f", {waits}" if waits else ""
        return f"{decision.why}: it would wait for a person (approve: the cloud){in_line}{hosts}"
    return f"{_cloud_why(seen, verdict)}{_budget_note(seen)}{hosts}"


def _cloud_why(seen: Seen, verdict: Verdict) -> str:
    decision = verdict.decision
    if seen.approval == "approved_over_budget":
        return f"a person approved it past the budget ({decision.why})"
    if seen.approval == "approved":
        return f"a person approved the cloud ({decision.why})"
    line, patience = seen.line, verdict.patience_s
    if patience is not None and line is not None:  # weighed, and the line's estimate passed it
        eta = "unknown" if line.eta_s is None else duration(line.eta_s)
        passed = f"the line's estimate ({eta}) passes its patience ({duration(patience)})"
        return f"{decision.why}; {passed}"
    return decision.why


def _budget_note(seen: Seen) -> str:
    view = seen.budget
    if seen.approval == "approved_over_budget":
        return ""
    if view is None or not view.totals_read:
        return "; the spend ledger checks the budget when it reserves the cost"
    figures = (
        view.day_remaining_usd,
        view.month_remaining_usd,
        view.team_day_remaining_usd,
        view.team_month_remaining_usd,
    )
    left = [v for v in figures if v is not None]
    if not left:
        return "; no cloud budget is set"
    estimate = "?" if view.estimate_usd is None else f"${view.estimate_usd:.2f}"
    return f"; the budget covers its estimate ({estimate} of ${min(left):.2f} left)"


def _hosts_note(seen: Seen) -> str:
    drained = seen.line.drained if seen.line is not None else []
    notes = [f"drained: {', '.join(drained)}"] if drained else []
    if seen.unfit:
        notes.append(f"cannot run its graph: {', '.join(seen.unfit)}")
    return f" ({'; '.join(notes)})" if notes else ""


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def about(eta_s: float | None) -> str:
    """`, about 3 min`, or nothing: no estimate, or one of now for a job still in line, which
    waits for what no place that frees gives it (headroom, a person, a drained host). Fast
    renders give estimates under a second: "about 1 s", never "0 s"."""
    if eta_s is None or eta_s <= 0:
        return ""
    return f", about {duration(max(eta_s, 1.0))}"


def duration(seconds: float) -> str:
    return f"{round(seconds)} s" if seconds < 90 else f"{round(seconds / 60)} min"
