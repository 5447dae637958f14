"""The seal on a spend ledger's input (docs/design.md, "The spend ledger and the budget", Who
starts the ledger): with SPILLWAY_LEDGER_SECRET set, a ledger run grants something only on input
it made itself (its predecessor's continue-as-new, marked `trusted` by a run that was) or on
input sealed with that secret just before the run started: the first start, which a worker makes,
and `spillway ledger restore`, which the operator runs. Anyone else who can start workflows in
the namespace can start a ledger, with any input, on spillway's queue; such a run grants nothing.

The seal is an HMAC over the ledger's id and the input as JSON, which names the time of sealing
and the run the new one follows. A sealed input is in the started run's history for anyone who
can read it, so a seal counts only for a run started within SEAL_FRESH of it, right after the run
it names (the reader checks that against the ledger's runs): copied into a later start, it is
stale or follows the wrong run.
"""

from __future__ import annotations

import hashlib
import hmac
from datetime import datetime, timedelta

from spillway.core.ledger import BudgetOrder, Budgets, LedgerInput

# How long before a run's start its input may have been sealed (a restore rebuilds the entries
# first, from the closed run's history), and how far after (the sealer's clock ahead of the
# server's).
SEAL_FRESH = timedelta(minutes=10)
CLOCK_SKEW = timedelta(minutes=1)
_VERSION = "v1"


def sealed(
    secret: str, ledger_id: str, inp: LedgerInput, at: datetime, after: str | None = None
) -> LedgerInput:
    """`inp`, sealed at `at` for the run of `ledger_id` that follows its run `after` (None: for
    its first run)."""
    bare = inp.model_copy(
        update={"sealed_at": at, "sealed_after": after, "seal": None, "trusted": None}
    )
    return bare.model_copy(update={"seal": _seal(secret, ledger_id, bare)})


def why_not_sealed(
    secret: str, ledger_id: str, inp: LedgerInput, started_at: datetime
) -> str | None:
    """Why `inp` is not a fresh seal for a run of `ledger_id` started at `started_at`; None
    when it is."""
    if inp.seal is None or inp.sealed_at is None:
        return "its input carries no seal"
    if not hmac.compare_digest(_seal(secret, ledger_id, inp), inp.seal):
        return "its input's seal is not the workers' (another secret, or the input was changed)"
    if not started_at - SEAL_FRESH <= inp.sealed_at <= started_at + CLOCK_SKEW:
        return (
            f"its input was sealed at {inp.sealed_at:%Y-%m-%d %H:%M:%S} UTC, not just before the "
            f"run started ({started_at:%Y-%m-%d %H:%M:%S} UTC): a seal copied from another start"
        )
    return None


def _seal(secret: str, ledger_id: str, inp: LedgerInput) -> str:
    body = inp.model_dump_json(exclude={"seal", "trusted"})
    mac = hmac.new(secret.encode(), f"{ledger_id}\n{body}".encode(), hashlib.sha256)
    return f"{_VERSION},{mac.hexdigest()}"


def signed_order(
    secret: str,
    ledger_id: str,
    budgets: Budgets,
    by: str,
    at: datetime,
    *,
    seed: bool = False,
    team: str | None = None,
) -> BudgetOrder:
    """An order for the studio's budgets, or (`team`) for that team's: the team is signed too,
    so an order for one team's budget can never be replayed as another's or the studio's."""
    order = BudgetOrder(
        ledger_id=ledger_id, budgets=budgets, by=by, issued_at=at, seed=seed, team=team
    )
    return order.model_copy(update={"signature": _order_mac(secret, order)})


def why_not_signed(secret: str, ledger_id: str, order: BudgetOrder, now: datetime) -> str | None:
    """Why the ledger `ledger_id` must not take `order` at `now`; None when it may."""
    if not order.signature or order.issued_at is None:
        return "it is not signed (`spillway budget` signs with SPILLWAY_LEDGER_SECRET)"
    if order.ledger_id != ledger_id:
        return f"it is signed for the ledger {order.ledger_id!r}, not {ledger_id!r}"
    if not hmac.compare_digest(_order_mac(secret, order), order.signature):
        return "its signature is not the workers' (another secret, or the order was changed)"
    if not now - SEAL_FRESH <= order.issued_at <= now + CLOCK_SKEW:
        return (
            f"it was issued at {order.issued_at:%Y-%m-%d %H:%M:%S} UTC, not just now: an order "
            "copied from an earlier one"
        )
    return None


def _order_mac(secret: str, order: BudgetOrder) -> str:
    body = order.model_dump_json(exclude={"signature"})
    mac = hmac.new(secret.encode(), f"budget\n{body}".encode(), hashlib.sha256)
    return f"{_VERSION},{mac.hexdigest()}"
