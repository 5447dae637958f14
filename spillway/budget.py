"""`spillway budget` and the budget part of `spillway health`: what the spend ledger holds, read
with a query (so through a running worker), or the configured budgets when nothing was spent."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.service import RPCError

from activities.ledger_client import SpendLedger
from activities.spend import budgets_of
from spillway.errors import Failed
from spillway.settings import Settings
from spillway.spend_models import LedgerSummary, PeriodTotals


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
        return summary
    budgets = budgets_of(settings)
    return LedgerSummary(
        day=_untouched(budgets.daily_usd), month=_untouched(budgets.monthly_usd), entries=[]
    )


def _untouched(budget: float | None) -> PeriodTotals:
    return PeriodTotals(budget_usd=budget, spent_usd=0, reserved_usd=0, remaining_usd=budget)


def render_budget(summary: LedgerSummary) -> str:
    def usd(value: float | None) -> str:
        return "no cap" if value is None else f"${value:.2f}"

    lines = [f"{'cloud spend (UTC)':<18}{'budget':>10}{'spent':>10}{'reserved':>10}{'left':>10}"]
    for label, totals in (("today", summary.day), ("this month", summary.month)):
        lines.append(
            f"  {label:<16}{usd(totals.budget_usd):>10}{usd(totals.spent_usd):>10}"
            f"{usd(totals.reserved_usd):>10}{usd(totals.remaining_usd):>10}"
        )
    if not summary.entries:
        lines.append("no cloud creates this month")
        return "\n".join(lines)
    lines.append("this month's creates (maybe_charged counts as spent):")
    for e in summary.entries:
        task = e.task_id or "-"
        lines.append(
            f"  {e.at:%Y-%m-%d %H:%M}  {e.job_id}  {e.provider}  task {task}  "
            f"{usd(e.cost_usd)}  {e.state}  {e.authorisation} by {e.authorised_by}"
        )
    return "\n".join(lines)
