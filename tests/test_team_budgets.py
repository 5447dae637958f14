"""Team budgets in the spend ledger (issue 62, item 4) as plain code: a create needs the studio's
budget and its team's to cover it, judged in one reservation by one book; the refusal names the
budget; each team's budget is set by its own signed order or seeded from the teams file, and
what a team spent survives a continue-as-new."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from spillway.core.decision import Seen, route
from spillway.core.gpu_pool import HostPlaces, InLine, PlaceView, PoolView
from spillway.core.ledger import (
    BeginCreate,
    BudgetOrder,
    Budgets,
    BudgetView,
    LedgerInput,
    ReserveRequest,
    SettleRequest,
    Vetted,
)
from spillway.core.ledger_seal import signed_order, why_not_signed
from spillway.core.models import LoadStatus, Thresholds
from spillway.core.spend_book import BUDGET_ORDER_REFUSED, SpendBook, SpendRefused
from spillway.core.teams import Team, TeamBudget, Teams
from tests.support.constants import CLIP_USD

NOW = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)


def reserve(book: SpendBook, job: str, team: str | None, at: datetime = NOW):
    request = ReserveRequest(
        job_id=job,
        run_id=f"run-{job}",
        provider="minimax",
        authorised_by="armed",
        authorisation="armed",
        team=team,
    )
    return book.reserve(request, Vetted(cost_usd=CLIP_USD, team=team), at)


def charge(book: SpendBook, job: str, at: datetime = NOW) -> None:
    book.begin(BeginCreate(job_id=job, run_id=f"run-{job}"), Vetted(), at)
    settle = SettleRequest(job_id=job, run_id=f"run-{job}", state="charged", task_id=f"t-{job}")
    book.settle(settle, Vetted(), at)


def team_order(
    team: str | None, daily: float | None, at: datetime, *, by: str = "ana", seed: bool = False
) -> BudgetOrder:
    return BudgetOrder(budgets=Budgets(daily_usd=daily), by=by, issued_at=at, seed=seed, team=team)


def refusal(call) -> SpendRefused:
    with pytest.raises(SpendRefused) as raised:
        call()
    return raised.value


def test_a_create_needs_its_teams_budget_beside_the_studios():
    book = SpendBook([], Budgets(daily_usd=10 * CLIP_USD))
    book.set_budgets(team_order("ads", 2 * CLIP_USD, NOW), NOW)
    reserve(book, "ads-1", "ads")
    reserve(book, "ads-2", "ads")
    short = refusal(lambda: reserve(book, "ads-3", "ads"))
    assert short.kind == "budget" and short.shortfall is not None
    assert (short.shortfall.team, short.shortfall.period) == ("ads", "day")
    assert short.shortfall.budget_name() == "team:ads"
    assert "team ads's daily cloud budget" in short.message
    # Another team, and a team with no budget of its own, spend the studio's as before.
    reserve(book, "film-1", "film")
    reserve(book, "old-1", None)
    assert book.totals("day", NOW).reserved_usd == pytest.approx(4 * CLIP_USD)
    assert book.totals("day", NOW, "ads").reserved_usd == pytest.approx(2 * CLIP_USD)
    assert book.totals("day", NOW, "film").remaining_usd is None  # no cap of its own


def test_a_studio_out_of_money_is_named_before_a_team_with_money_left():
    book = SpendBook([], Budgets(daily_usd=CLIP_USD))
    book.set_budgets(team_order("ads", 5 * CLIP_USD, NOW), NOW)
    reserve(book, "film-1", "film")
    short = refusal(lambda: reserve(book, "ads-1", "ads")).shortfall
    assert short is not None and short.team is None and short.budget_name() == "studio"
    assert "team" not in short.text()


def test_a_reservation_taken_over_counts_back_in_its_teams_budget_only():
    book = SpendBook([], Budgets())
    book.set_budgets(team_order("ads", CLIP_USD, NOW), NOW)
    reserve(book, "ads-1", "ads")
    again = ReserveRequest(
        job_id="ads-1",
        run_id="run-reset",
        provider="minimax",
        authorised_by="armed",
        authorisation="armed",
        team="ads",
    )
    taken = book.reserve(again, Vetted(cost_usd=CLIP_USD, team="ads"), NOW)
    assert taken.team == "ads" and taken.run_id == "run-reset"


def test_what_a_team_spent_survives_a_continue_as_new_and_old_days_leave():
    book = SpendBook([], Budgets(daily_usd=20 * CLIP_USD))
    book.set_budgets(team_order("ads", 3 * CLIP_USD, NOW), NOW)
    for n in range(3):
        reserve(book, f"ads-{n}", "ads")
        charge(book, f"ads-{n}")
    carried = book.carried(NOW, 2000)
    assert carried.entries == []  # settled: only their totals travel
    assert carried.team_spent["ads"][f"{NOW:%Y-%m-%d}"] == pytest.approx(3 * CLIP_USD)
    following = SpendBook.of(LedgerInput.model_validate_json(carried.model_dump_json()))
    assert following.totals("day", NOW, "ads").remaining_usd == pytest.approx(0)
    assert refusal(lambda: reserve(following, "ads-9", "ads")).shortfall is not None
    later = NOW + timedelta(days=3)
    assert f"{NOW:%Y-%m-%d}" not in following.carried(later, 2000).team_spent["ads"]
    assert following.totals("day", later, "ads").remaining_usd == pytest.approx(3 * CLIP_USD)
    assert following.totals("month", later, "ads").spent_usd == pytest.approx(3 * CLIP_USD)


def test_a_ledger_without_teams_carries_no_team_keys():
    book = SpendBook([], Budgets())
    reserve(book, "old-1", None)
    charge(book, "old-1")
    dumped = book.carried(NOW, 2000).model_dump()
    assert not {"team_budgets", "team_budget_set", "team_spent"} & set(dumped)
    assert all("team" not in e for e in book.carried(NOW, 2000).model_dump()["entries"])


def test_each_teams_budget_is_set_by_its_own_orders_and_seeded_only_while_never_set():
    book = SpendBook([], Budgets(daily_usd=5.0))
    seeded = book.set_budgets(team_order("ads", 1.0, NOW, by="worker", seed=True), NOW)
    assert seeded == Budgets(daily_usd=1.0) and book.budgets == Budgets(daily_usd=5.0)
    later = NOW + timedelta(minutes=1)
    again = book.set_budgets(team_order("ads", 9.0, later, by="worker b", seed=True), later)
    assert again == Budgets(daily_usd=1.0)
    assert book.set_budgets(team_order("ads", 2.0, later, by="ben"), later).daily_usd == 2.0
    stale = refusal(lambda: book.set_budgets(team_order("ads", 7.0, later, by="eve"), later))
    assert stale.kind == BUDGET_ORDER_REFUSED and "team ads's budget" in stale.message
    # The studio's own order history is apart from the team's.
    assert book.set_budgets(team_order(None, 6.0, later, by="ben"), later).daily_usd == 6.0
    assert book.set_budgets(team_order("film", 3.0, NOW, by="worker", seed=True), NOW).daily_usd
    summary = book.summary(later)
    assert set(summary.teams) == {"ads", "film"}
    assert summary.teams["ads"].budget_set is not None
    assert summary.teams["ads"].budget_set.by == "ben"


def test_a_team_order_is_signed_with_its_team_and_a_studio_order_signs_as_before():
    at = datetime.now(UTC)
    for_ads = signed_order("secret", "ledger", Budgets(daily_usd=1.0), "ana", at, team="ads")
    assert why_not_signed("secret", "ledger", for_ads, at) is None
    as_studio = for_ads.model_copy(update={"team": None})
    assert "signature" in (why_not_signed("secret", "ledger", as_studio, at) or "")
    as_film = for_ads.model_copy(update={"team": "film"})
    assert "signature" in (why_not_signed("secret", "ledger", as_film, at) or "")
    studio = signed_order("secret", "ledger", Budgets(daily_usd=1.0), "ana", at)
    assert "team" not in studio.model_dump()
    assert why_not_signed("secret", "ledger", studio, at) is None


def test_a_quote_names_the_teams_budget_as_the_ledger_would():
    view = BudgetView(
        estimate_usd=CLIP_USD,
        day_remaining_usd=5.0,
        day_budget_usd=5.0,
        team="ads",
        team_day_remaining_usd=0.1,
        team_day_budget_usd=1.0,
    )
    load = LoadStatus(
        reachable=True,
        overloaded=True,
        reasons=["vram_used_95.0pct_ge_85.0pct"],
        measured_at=NOW,
        thresholds=Thresholds(vram_busy_pct=85, util_busy_pct=95),
    )
    verdict = route(Seen(load=load, armed=True, has_cloud=True, budget=view))
    assert verdict.quote == "await_approval" and verdict.shortfall is not None
    assert verdict.shortfall.team == "ads"
    assert "team ads's daily cloud budget" in verdict.why


def test_team_list_counts_places_and_the_line_by_team_and_the_default_takes_the_unnamed():
    from spillway.client.teams import team_rows

    teams = Teams(
        default="film",
        teams={
            "film": Team(share=2),
            "ads": Team(budget=TeamBudget(day_usd=5.0, month_usd=80.0)),
        },
    )
    view = PoolView(
        hosts=[
            HostPlaces(
                name="a40",
                max_jobs=2,
                reachable=True,
                headroom=True,
                places=[
                    PlaceView(job_id="j1", since=NOW, team="ads"),
                    PlaceView(job_id="j2", since=NOW, team=None),
                ],
            )
        ],
        line=[
            InLine(
                job_id="j3", position=1, priority=3, since=NOW, mode="any", eta_s=None, team="ads"
            ),
            InLine(
                job_id="j4", position=2, priority=3, since=NOW, mode="any", eta_s=None, team="ads"
            ),
        ],
    )
    book = SpendBook([], Budgets())
    book.set_budgets(team_order("ads", 5.0, NOW), NOW)
    reserve(book, "ads-1", "ads")
    rows = {r.team: r for r in team_rows(teams, view, book.summary(NOW))}
    assert (rows["film"].share, rows["film"].places_held, rows["film"].waiting) == (2, 1, 0)
    assert (rows["ads"].places_held, rows["ads"].waiting) == (1, 2)
    assert rows["film"].budget is None
    assert rows["ads"].budget is not None
    assert rows["ads"].budget.day_left_usd == pytest.approx(5.0 - CLIP_USD)
    assert rows["ads"].budget.month_left_usd is None
