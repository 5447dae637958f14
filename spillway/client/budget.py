"""What the spend ledger holds (`spillway budget`, the budget part of `spillway health`), read
with a query (so through a running worker), or the configured budgets when nothing was spent."""

from __future__ import annotations

from temporalio.client import Client
from temporalio.service import RPCError

from activities.spend.ledger import SpendLedger
from activities.spend.vet import budgets_of
from spillway.errors import Failed
from spillway.settings import Settings
from spillway.spend_book import LedgerSummary, PeriodTotals


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
