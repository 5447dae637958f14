"""The teams as people see them (`spillway team list`, docs/design.md, "A studio of several
teams"): each team's share from the teams file, the GPU places its jobs hold and how many wait,
from the GPU pool's view, and what its own budget has left, from the spend ledger. Read through a
running worker (the pool's and the ledger's queries)."""

from __future__ import annotations

from collections import Counter

from pydantic import BaseModel
from temporalio.client import Client

from spillway.client.budget import ledger_summary, team_spend
from spillway.client.queue import pool_view
from spillway.core.gpu_pool import PoolView
from spillway.core.ledger import LedgerSummary
from spillway.core.settings import Settings
from spillway.core.teams import Teams, load_teams


class BudgetLeft(BaseModel):
    day_left_usd: float | None
    month_left_usd: float | None


class TeamRow(BaseModel):
    """One team of `spillway team list --json`; `budget` null: no budget of its own (only the
    studio's applies)."""

    team: str
    share: float
    places_held: int
    waiting: int
    budget: BudgetLeft | None


def team_rows(teams: Teams, view: PoolView, summary: LedgerSummary) -> list[TeamRow]:
    """A job the pool shows without a team (asked before teams) counts as the default team's."""
    held = Counter(p.team or teams.default for host in view.hosts for p in host.places)
    waiting = Counter(w.team or teams.default for w in view.line)
    rows = []
    for name, team in teams.teams.items():
        spend = team_spend(summary, name)
        has_budget = spend.day.budget_usd is not None or spend.month.budget_usd is not None
        budget = (
            BudgetLeft(
                day_left_usd=spend.day.remaining_usd, month_left_usd=spend.month.remaining_usd
            )
            if has_budget
            else None
        )
        rows.append(
            TeamRow(
                team=name,
                share=team.share,
                places_held=held[name],
                waiting=waiting[name],
                budget=budget,
            )
        )
    return rows


async def team_list(client: Client, settings: Settings) -> list[TeamRow]:
    teams = load_teams(settings.SPILLWAY_TEAMS_FILE)
    view = await pool_view(client, settings.SPILLWAY_TASK_QUEUE)
    summary = await ledger_summary(client, settings)
    return team_rows(teams, view, summary)
