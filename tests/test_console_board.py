"""The console's spend chart, from the ledger's entries alone: per UTC day and team, what was
charged, may have been charged or is reserved; what was released or refused costs nothing."""

from __future__ import annotations

from datetime import UTC, datetime

from spillway.console.app import spend_by_day_and_team
from spillway.core.ledger import LedgerSummary, PeriodTotals, SpendEntry


def entry(day: int, state: str, cost: float | None, team: str | None) -> SpendEntry:
    return SpendEntry.model_validate(
        {
            "job_id": f"job-{day}-{state}-{team}",
            "run_id": "run",
            "provider": "minimax",
            "cost_usd": cost,
            "state": state,
            "authorised_by": "ana",
            "authorisation": "approved",
            "at": datetime(2026, 12, day, 10, tzinfo=UTC),
            "team": team,
        }
    )


def test_spend_is_summed_per_day_and_team_and_what_cost_nothing_is_left_out():
    totals = PeriodTotals(budget_usd=5.0, spent_usd=1.0, reserved_usd=0.28, remaining_usd=3.72)
    summary = LedgerSummary(
        day=totals,
        month=totals,
        entries=[
            entry(5, "charged", 0.28, "film"),
            entry(5, "charged", 0.28, "film"),
            entry(5, "maybe_charged", 0.5, "ads"),
            entry(6, "reserved", 0.28, None),  # before teams: the studio's
            entry(6, "released", 0.28, "film"),
            entry(6, "refused", 0.28, "ads"),
            entry(6, "charged", None, "ads"),  # no estimate known
        ],
    )
    spend = spend_by_day_and_team(summary)
    assert spend["teams"] == ["ads", "film", "studio"]
    assert spend["days"] == [
        {"day": "2026-12-05", "by_team": {"film": 0.56, "ads": 0.5}},
        {"day": "2026-12-06", "by_team": {"studio": 0.28}},
    ]
    assert spend["today_spent_usd"] == 1.28 and spend["day_budget_usd"] == 5.0
