"""The quote is the decision (issue 59, item 3): `spillway.core.decision.route` over the budget
(spent, short, enough, unknown, a person's approval past it), the patience (none, within, past,
an unknown estimate, a deadline), drained hosts and hosts that cannot run the graph. Each row
pins the route and the why; the budget rows also hold the figures a quote reads against the
refusal the spend ledger's own book gives a job, and both must say the same thing."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

import pytest

from spillway.core.decision import BUDGET_EXHAUSTED, Line, Seen, route
from spillway.core.ledger import Budgets, BudgetView
from spillway.core.models import LoadStatus, Thresholds
from spillway.core.spend_book import SpendBook
from tests.support.constants import CLIP_USD

NOW = datetime(2026, 12, 6, 18, 0, tzinfo=UTC)
HOSTS = ("a40_1", "a40_2")
FULL = ["gpu_places_full_a40_1_2of2", "gpu_places_full_a40_2_2of2"]


def reading(overloaded: bool = False, reachable: bool = True) -> LoadStatus:
    return LoadStatus(
        reachable=reachable,
        overloaded=overloaded,
        reasons=["vram_used_97.0pct_ge_85.0pct"] if overloaded else [],
        measured_at=NOW,
        thresholds=Thresholds(vram_busy_pct=85, util_busy_pct=95),
    )


def ledger(day_usd: float | None, month_usd: float | None, spent_today: float) -> SpendBook:
    """The spend ledger's book with `spent_today` charged this day (and month)."""
    spent = {f"{NOW:%Y-%m-%d}": spent_today, f"{NOW:%Y-%m}": spent_today}
    return SpendBook([], Budgets(daily_usd=day_usd, monthly_usd=month_usd), spent=spent)


def view_of(book: SpendBook, estimate: float | None = CLIP_USD) -> BudgetView:
    """The budget view a quote reads of that book (activities/spend/activities.py, `view`)."""
    day, month = book.totals("day", NOW), book.totals("month", NOW)

    def left(remaining: float | None) -> float | None:
        return None if remaining is None else round(max(remaining, 0.0), 2)

    return BudgetView(
        estimate_usd=estimate,
        day_remaining_usd=left(day.remaining_usd),
        month_remaining_usd=left(month.remaining_usd),
        day_budget_usd=day.budget_usd,
        month_budget_usd=month.budget_usd,
    )


@dataclass(frozen=True)
class Row:
    name: str
    seen: dict[str, Any]
    quote: str  # the route a quote and the job's plan.quote name
    job: str  # the route the job acts on (local, cloud, await)
    says: list[str] = field(default_factory=list)  # in the why, in this order
    never: list[str] = field(default_factory=list)  # not in the why
    book: SpendBook | None = None  # the ledger: the quote reads its figures, a job its refusal


ARMED_FULL = {"armed": True, "line": Line(position=3, eta_s=240.0, render_s=60.0, full=FULL)}
SPENT = ledger(5.0, None, 5.0)
SHORT = ledger(5.0, None, 4.9)
ENOUGH = ledger(5.0, 100.0, 1.0)
MONTH_SPENT = ledger(5.0, 20.0, 0.0)
MONTH_SPENT.spent[f"{NOW:%Y-%m}"] = 19.9

ROWS = [
    # --- the budget, for an armed job whose hosts are full --------------------------------
    Row(
        "the day's budget spent: a person decides, budget_exhausted (day)",
        ARMED_FULL,
        "await_approval",
        "await",
        [
            "budget_exhausted (day)",
            "the daily cloud budget ($5.00) has $0.00 left; this job's estimate is $0.28",
            "--over-budget",
            "3rd in line for the GPUs, about 4 min",
        ],
        ["is armed"],
        SPENT,
    ),
    Row(
        "the day's budget short of the estimate",
        ARMED_FULL,
        "await_approval",
        "await",
        ["budget_exhausted (day)", "has $0.10 left; this job's estimate is $0.28"],
        book=SHORT,
    ),
    Row(
        "the month's budget spent while the day's is not",
        ARMED_FULL,
        "await_approval",
        "await",
        ["budget_exhausted (month)", "the monthly cloud budget ($20.00) has $0.10 left"],
        book=MONTH_SPENT,
    ),
    Row(
        "enough budget: the cloud",
        ARMED_FULL,
        "cloud",
        "cloud",
        ["the cloud fallback is armed", "the budget covers its estimate ($0.28 of $4.00 left)"],
        [BUDGET_EXHAUSTED],
        ENOUGH,
    ),
    Row(
        "no budget set: the cloud",
        ARMED_FULL,
        "cloud",
        "cloud",
        ["the cloud fallback is armed", "no cloud budget is set"],
        book=ledger(None, None, 0.0),
    ),
    Row(
        "the budget not read: the cloud, the ledger checks when it reserves",
        {**ARMED_FULL, "budget": None},
        "cloud",
        "cloud",
        ["the cloud fallback is armed", "the spend ledger checks the budget when it reserves"],
    ),
    Row(
        "the ledger's totals not read: not known, so not refused here",
        {**ARMED_FULL, "budget": BudgetView(estimate_usd=CLIP_USD, totals_read=False)},
        "cloud",
        "cloud",
        ["the spend ledger checks the budget when it reserves"],
    ),
    Row(
        "a person approved past the spent budget: the cloud, no quote's concern",
        {**ARMED_FULL, "approval": "approved_over_budget"},
        "cloud",
        "cloud",
        ["a person approved it past the budget"],
        [BUDGET_EXHAUSTED],
        SPENT,
    ),
    Row(
        "a plain approval the budget cannot cover still waits for an over-budget one",
        {**ARMED_FULL, "armed": False, "approval": "approved"},
        "await_approval",
        "await",
        ["budget_exhausted (day)", "--over-budget"],
        book=SPENT,
    ),
    Row(
        "a plain approval the budget covers: the cloud",
        {**ARMED_FULL, "armed": False, "approval": "approved"},
        "cloud",
        "cloud",
        ["a person approved the cloud", "the budget covers its estimate"],
        book=ENOUGH,
    ),
    Row(
        "sent to the cloud as armed, its host lost under it, the budget spent",
        {"armed": True, "line": Line(host="a40_2", eta_s=0.0), "approval": "armed"},
        "await_approval",
        "await",
        ["budget_exhausted (day)", "--over-budget"],
        ["a place on", "the GPU hosts are"],
        SPENT,
    ),
    Row(
        "sent to the cloud as armed, its patience over, the budget spent",
        {**ARMED_FULL, "patience_s": 600.0, "approval": "armed"},
        "await_approval",
        "await",
        ["budget_exhausted (day)", "(the GPU hosts are overloaded)"],
        ["within its patience"],
        SPENT,
    ),
    Row(
        "overloaded and armed with the budget spent: never asks the pool, waits for a person",
        {"load": reading(overloaded=True), "armed": True},
        "await_approval",
        "await",
        ["budget_exhausted (day)", "(the GPU hosts are overloaded)"],
        ["in line"],
        SPENT,
    ),
    Row(
        "unreachable and armed with the budget spent",
        {"load": reading(reachable=False), "armed": True},
        "await_approval",
        "await",
        ["budget_exhausted (day)", "(the GPU hosts are unreachable)"],
        book=SPENT,
    ),
    Row(
        "not armed: a person decides, the budget aside",
        {**ARMED_FULL, "armed": False},
        "await_approval",
        "await",
        ["the cloud fallback is not armed: a person decides", "3rd in line"],
        [BUDGET_EXHAUSTED],
        SPENT,
    ),
    Row(
        "no cloud prompt: the line, nobody is asked",
        {**ARMED_FULL, "armed": False, "has_cloud": False},
        "local",
        "await",
        [
            "3rd in line for the GPUs, about 4 min; it runs locally when a place frees",
            "the job asks for no cloud: it waits for a GPU place",
        ],
        [BUDGET_EXHAUSTED, "a person"],
    ),
    Row(
        "no cloud prompt, ComfyUI silent: it waits for a host to answer, nobody is asked",
        {"load": reading(reachable=False), "has_cloud": False},
        "local",
        "await",
        ["the GPU hosts are unreachable and the job asks for no cloud: it waits for a GPU host"],
        ["a person"],
    ),
    # --- the patience ---------------------------------------------------------------------
    Row(
        "patient, the line's estimate within: it waits here, the spent budget does not matter",
        {**ARMED_FULL, "patience_s": 600.0},
        "local",
        "cloud",
        ["3rd in line", "within its patience of 10 min"],
        [BUDGET_EXHAUSTED],
        SPENT,
    ),
    Row(
        "patient, the line's estimate past it: the cloud",
        {**ARMED_FULL, "patience_s": 120.0},
        "cloud",
        "cloud",
        ["the line's estimate (4 min) passes its patience (2 min)", "the budget covers"],
        book=ENOUGH,
    ),
    Row(
        "patient, the line's estimate past it, the budget spent: a person decides",
        {**ARMED_FULL, "patience_s": 120.0},
        "await_approval",
        "await",
        ["budget_exhausted (day)"],
        book=SPENT,
    ),
    Row(
        "patient, no estimate yet (a new pool): it waits here, its patience ends the wait",
        {**ARMED_FULL, "line": Line(position=1, full=FULL), "patience_s": 600.0},
        "local",
        "cloud",
        ["1st in line", "within its patience of 10 min"],
        ["passes its patience"],
        book=ENOUGH,
    ),
    Row(
        "no patience left and no estimate: the cloud",
        {**ARMED_FULL, "line": Line(position=1, full=FULL), "patience_s": 0.0},
        "cloud",
        "cloud",
        ["the line's estimate (unknown) passes its patience (0 s)"],
        book=ENOUGH,
    ),
    Row(
        "a deadline keeps a render's time: 280 s of patience less a 60 s render is short of 240",
        {**ARMED_FULL, "patience_s": 280.0, "by_deadline": True},
        "cloud",
        "cloud",
        ["passes its patience (4 min)"],
        book=ENOUGH,
    ),
    Row(
        "the same 280 s as a max wait covers the line's 240",
        {**ARMED_FULL, "patience_s": 280.0},
        "local",
        "cloud",
        ["within its patience of 5 min"],
        book=ENOUGH,
    ),
    Row(
        "overloaded by its probe, armed, patient: the cloud at once, the line never weighed",
        {**ARMED_FULL, "load": reading(overloaded=True), "patience_s": 600.0},
        "cloud",
        "cloud",
        ["the GPU hosts are overloaded and the cloud fallback is armed", "the budget covers"],
        ["patience"],
        ENOUGH,
    ),
    Row(
        "not patient: no patience without being armed",
        {**ARMED_FULL, "armed": False, "has_cloud": False, "patience_s": 600.0},
        "local",
        "await",
        ["it runs locally when a place frees"],
        ["patience"],
    ),
    # --- hosts ---------------------------------------------------------------------------
    Row(
        "a place now",
        {"line": Line(host="a40_2", eta_s=0.0)},
        "local",
        "local",
        ["a place on a40_2 now (a GPU host has headroom)"],
        book=SPENT,
    ),
    Row(
        "every host drained, armed, the budget spent: a person decides, naming the drain",
        {
            "armed": True,
            "line": Line(position=1, full=["gpu_host_drained_a40_1", "gpu_host_drained_a40_2"]),
        },
        "await_approval",
        "await",
        ["budget_exhausted (day)", "1st in line", "(drained: a40_1, a40_2)"],
        book=SPENT,
    ),
    Row(
        "one host drained, the other full, not armed",
        {
            "line": Line(position=2, eta_s=30.0, full=["gpu_host_drained_a40_1", FULL[1]]),
        },
        "await_approval",
        "await",
        ["not armed: a person decides", "2nd in line for the GPUs, about 30 s", "drained: a40_1"],
    ),
    Row(
        "a host that cannot run the graph is no place for it, and the why says so",
        {"unfit": ("a40_1",), "line": Line(host="a40_2", eta_s=0.0)},
        "local",
        "local",
        ["a place on a40_2 now", "cannot run its graph: a40_1"],
    ),
    Row(
        "the host that can run it is full, armed, the budget spent",
        {**ARMED_FULL, "unfit": ("a40_1",)},
        "await_approval",
        "await",
        ["budget_exhausted (day)", "cannot run its graph: a40_1"],
        book=SPENT,
    ),
]


def seen_of(row: Row) -> Seen:
    fields: dict[str, Any] = {"load": reading(), "armed": False, "has_cloud": True, "hosts": HOSTS}
    if row.book is not None:
        fields["budget"] = view_of(row.book)
    return Seen(**(fields | row.seen))


@pytest.mark.parametrize("row", ROWS, ids=[r.name for r in ROWS])
def test_the_quote_s_route_and_why_are_the_decision_s(row: Row):
    verdict = route(seen_of(row))
    assert (verdict.quote, verdict.route) == (row.quote, row.job), verdict.why
    at = 0
    for part in row.says:
        found = verdict.why.find(part, at)
        assert found >= 0, f"{part!r} not in (or out of order in) {verdict.why!r}"
        at = found + len(part)
    for part in row.never:
        assert part not in verdict.why, verdict.why
    unfit = set(row.seen.get("unfit", ()))
    assert verdict.local.hosts == [h for h in HOSTS if h not in unfit]


BUDGET_ROWS = [r for r in ROWS if r.book is not None]


@pytest.mark.parametrize("row", BUDGET_ROWS, ids=[r.name for r in BUDGET_ROWS])
def test_a_quote_from_the_figures_says_what_the_job_refused_by_the_ledger_says(row: Row):
    """A quote reads the figures; a job learns the budget from the ledger's refusal when it
    reserves (its first decision knows no figures). Both end on the same route and why."""
    assert row.book is not None
    quoted = route(seen_of(row))
    job = replace(seen_of(row), budget=None)
    approval = row.seen.get("approval")
    if approval != "approved_over_budget":
        refusal = row.book.shortfall(CLIP_USD, NOW)
        if refusal is not None:
            job = job.refused(refusal)
    decided = route(job)
    assert (decided.quote, decided.route) == (quoted.quote, quoted.route)
    if quoted.shortfall is not None:
        assert decided.why == quoted.why
        assert decided.shortfall == quoted.shortfall


def test_a_job_that_decided_cloud_and_was_refused_no_longer_says_armed():
    """The new user's report: status said "decided cloud: ... armed" for a job that waited for
    approval with budget_exhausted."""
    first = Seen(load=reading(overloaded=True), armed=True, has_cloud=True, hosts=HOSTS)
    decided = route(first)
    assert decided.quote == "cloud" and "armed" in decided.why
    refusal = SPENT.shortfall(CLIP_USD, NOW)
    assert refusal is not None
    after = route(first.refused(refusal))
    assert (after.quote, after.route) == ("await_approval", "await")
    assert after.why.startswith("budget_exhausted (day): " + refusal.text())
    assert "fallback is armed" not in after.why


def test_an_unknown_estimate_is_never_covered_by_a_budget():
    """Money fails closed: the ledger refuses a cost it does not know, and so does a quote."""
    verdict = route(replace(seen_of(ROWS[0]), budget=view_of(ENOUGH, estimate=None)))
    assert verdict.quote == "await_approval"
    assert "this job's estimate is unknown" in verdict.why
