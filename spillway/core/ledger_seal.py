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

from spillway.core.ledger import LedgerInput

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
