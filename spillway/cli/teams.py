"""How `spillway team list` and `spillway budget --team` print for people (--json prints the
models as they are)."""

from __future__ import annotations

from spillway.client.teams import TeamRow
from spillway.core.ledger import TeamSpend


def _usd(value: float | None) -> str:
    return "no cap" if value is None else f"${value:.2f}"


def render_teams(rows: list[TeamRow]) -> str:
    lines = [
        f"{'team':<16}{'share':>7}{'places':>8}{'waiting':>9}{'day left':>11}{'month left':>12}"
    ]
    for row in rows:
        day = _usd(row.budget.day_left_usd) if row.budget else "-"
        month = _usd(row.budget.month_left_usd) if row.budget else "-"
        lines.append(
            f"{row.team:<16}{row.share:>7g}{row.places_held:>8}{row.waiting:>9}{day:>11}{month:>12}"
        )
    lines.append("-: no budget of its own (the studio's applies to every team: spillway budget)")
    return "\n".join(lines)


def render_team_spend(spend: TeamSpend) -> str:
    lines = [
        f"team {spend.team}'s cloud spend (UTC), beside the studio's budget (spillway budget):",
        f"{'':<18}{'budget':>10}{'spent':>10}{'reserved':>10}{'left':>10}",
    ]
    for label, totals in (("today", spend.day), ("this month", spend.month)):
        lines.append(
            f"  {label:<16}{_usd(totals.budget_usd):>10}{_usd(totals.spent_usd):>10}"
            f"{_usd(totals.reserved_usd):>10}{_usd(totals.remaining_usd):>10}"
        )
    held = spend.budget_set
    if held is None:
        lines.append("its budget was never set: only the studio's applies to its jobs")
    else:
        how = "seeded from the teams file by" if held.seed else "set by"
        lines.append(f"its budget was {how} {held.by} at {held.at:%Y-%m-%d %H:%M:%S} UTC")
    return "\n".join(lines)
