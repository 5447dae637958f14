"""The budgets a cloud create must fit, and which order sets them (docs/design.md, "The spend
ledger and the budget" and "A studio of several teams"): the studio's day and month, and beside
them the day and month of the job's team when that team has a budget of its own. A create fits
only when every one of them covers its estimate, counting what is spent (charged, maybe charged)
and what is reserved; only `approved_over_budget` goes past them.

Pure, like the rest of the book's rules: the book (spend_book.py) gives the totals of one moment
and applies the verdict, so "fits the studio's and the team's" is decided in the one vet of one
request, with no second counter anywhere. Nothing here reads a clock or holds state.

Who sets a budget: a signed order (`spillway budget [--team NAME]`, checked by the vet) replaces
it only when newer than the order in force for that same budget; a worker's announce at start
(`seed`: its CLOUD_*_BUDGET_USD for the studio, the teams file's `budget` for a team) sets it
only while that budget was never set.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime

from spillway.core.ledger import BudgetOrder, BudgetSetBy, BudgetShortfall, Period

CENT = 1e-9


@dataclass(frozen=True)
class Left:
    """What one budget has left in one period, at one moment."""

    period: Period
    budget_usd: float
    remaining_usd: float
    team: str | None = None  # None: the studio's


def short_of(
    period: Period,
    budget_usd: float,
    remaining_usd: float,
    cost_usd: float | None,
    team: str | None = None,
) -> BudgetShortfall | None:
    """One budget's verdict on a cost: the ledger's refusal, or None when it covers it. A cost
    not known is never covered (money fails closed). `spillway quote` asks the same rule of the
    figures the budget view read, so that a quote says what the ledger would."""
    if cost_usd is not None and cost_usd <= remaining_usd + CENT:
        return None
    return BudgetShortfall(
        period=period,
        budget_usd=budget_usd,
        remaining_usd=round(max(remaining_usd, 0.0), 2) + 0.0,
        estimate_usd=cost_usd,
        team=team,
    )


def first_short(cost_usd: float | None, budgets: Iterable[Left]) -> BudgetShortfall | None:
    """The first budget that cannot cover the cost, in the order given (the book gives the
    studio's before the team's, so a studio that is out names the studio); None: all cover it."""
    for left in budgets:
        short = short_of(left.period, left.budget_usd, left.remaining_usd, cost_usd, left.team)
        if short is not None:
            return short
    return None


class OrderNotTaken(Exception):
    """An order that must change nothing and be told so (a seed that finds a budget set is not
    one: it changes nothing quietly)."""


def takes(order: BudgetOrder, held: BudgetSetBy | None, is_set: bool) -> bool:
    """Whether the budget the order names takes it: a seed only while that budget was never set,
    any other order only when newer than the one in force. False: a seed, ignored;
    OrderNotTaken: an order refused, with why."""
    whose = "the studio's" if order.team is None else f"team {order.team}'s"
    if order.issued_at is None:
        raise OrderNotTaken("a budget order without its time changes nothing")
    if order.seed:
        return not is_set
    if held is not None and order.issued_at <= held.issued_at:
        raise OrderNotTaken(
            f"the budget order by {order.by} for {whose} budget, issued at "
            f"{order.issued_at:%Y-%m-%d %H:%M:%S} UTC, is not newer than the one in force (by "
            f"{held.by}, issued {held.issued_at:%Y-%m-%d %H:%M:%S} UTC): nothing changed"
        )
    return True


def set_by(order: BudgetOrder, now: datetime) -> BudgetSetBy:
    assert order.issued_at is not None
    return BudgetSetBy(by=order.by, issued_at=order.issued_at, at=now, seed=order.seed)
