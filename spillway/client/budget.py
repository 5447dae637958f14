"""What the spend ledger holds (`spillway budget`, the budget part of `spillway health`), read
with a query (so through a running worker), and the budget orders `spillway budget --day/--month`
sends it (signed with SPILLWAY_LEDGER_SECRET: the budget is the ledger's, set in one place)."""

from __future__ import annotations

from datetime import datetime

from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError, RPCStatusCode

from activities.spend.ledger import SpendLedger
from spillway.core import names
from spillway.core.errors import ConfigError, Failed
from spillway.core.ledger import (
    Budgets,
    LedgerSummary,
    MonthSpend,
    Period,
    PeriodTotals,
    SpendEntry,
    TeamSpend,
)
from spillway.core.settings import Settings
from spillway.core.spend_book import SpendRefused


async def ledger_summary(client: Client, settings: Settings) -> LedgerSummary:
    ledger = SpendLedger(client, settings.SPILLWAY_TASK_QUEUE)
    try:
        summary = await ledger.summary()
    except RPCError as exc:
        raise Failed(
            f"the spend ledger ({ledger.workflow_id}) did not answer ({exc.message}): it is read "
            "through a running worker (spillway worker)"
        ) from None
    if summary is not None:
        summary.closed_as = await ledger.closed_as()
        return summary
    # No ledger yet: no budget is set (a worker's own settings are not the budget).
    return LedgerSummary(day=_untouched(None), month=_untouched(None), entries=[])


UNSIGNED = (
    "SPILLWAY_LEDGER_SECRET is not set here: a budget order is signed with it (the workers' "
    "secret), and the ledger takes no other"
)


def team_spend(summary: LedgerSummary, team: str) -> TeamSpend:
    """`spillway budget --team NAME`: that team's spending and its own budget, as the ledger
    holds them (a team the ledger never heard of has spent nothing and has no budget)."""
    held = summary.teams.get(team)
    if held is not None:
        return held
    return TeamSpend(team=team, day=_untouched(None), month=_untouched(None))


async def order_budget(
    client: Client,
    settings: Settings,
    changes: dict[Period, float | None],
    by: str,
    team: str | None = None,
) -> LedgerSummary:
    """Sets the day's and/or the month's budget (None: no cap) in the ledger, the other as it
    is: the studio's, or `team`'s own; Failed when the ledger refuses the order or does not
    answer."""
    secret = settings.SPILLWAY_LEDGER_SECRET
    if secret is None:
        raise ConfigError(UNSIGNED)
    ledger = SpendLedger(client, settings.SPILLWAY_TASK_QUEUE, seal_with=secret)
    summary = await ledger_summary(client, settings)
    held = (summary.day, summary.month) if team is None else _totals(team_spend(summary, team))
    budgets = Budgets(
        daily_usd=changes.get("day", held[0].budget_usd),
        monthly_usd=changes.get("month", held[1].budget_usd),
    )
    try:
        await ledger.order(budgets, by, team=team)
    except SpendRefused as refused:
        raise Failed(refused.message) from None
    except ApplicationError as err:  # did not answer, or closed: nothing changed
        raise Failed(err.message) from None
    return await ledger_summary(client, settings)


def _totals(spend: TeamSpend) -> tuple[PeriodTotals, PeriodTotals]:
    return spend.day, spend.month


def _untouched(budget: float | None) -> PeriodTotals:
    return PeriodTotals(budget_usd=budget, spent_usd=0, reserved_usd=0, remaining_usd=budget)


async def month_spend(client: Client, settings: Settings, month: str) -> MonthSpend:
    """`spillway budget --month YYYY-MM`: the total from the ledger, the entries from the
    histories of its runs (each continue-as-new leaves one behind), the latest word on each."""
    from activities.spend.history import ledger_runs, rebuilt

    ledger_id = names.ledger_id(settings.SPILLWAY_TASK_QUEUE)
    try:
        spent = await client.get_workflow_handle(ledger_id).query(
            names.LEDGER_MONTH, month, result_type=float
        )
    except RPCError as exc:
        if exc.status != RPCStatusCode.NOT_FOUND:
            raise Failed(f"the spend ledger ({ledger_id}) did not answer ({exc.message})") from None
        spent = 0.0
    runs = await ledger_runs(client, settings.SPILLWAY_TASK_QUEUE)
    by_key: dict[tuple[str, datetime], SpendEntry] = {}
    for run in runs:
        held = await rebuilt(client, run)
        by_key.update({(e.job_id, e.at): e for e in held.entries if f"{e.at:%Y-%m}" == month})
    entries = sorted(by_key.values(), key=lambda e: e.at)
    return MonthSpend(month=month, spent_usd=spent, entries=entries, runs_read=len(runs))
