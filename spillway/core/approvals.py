"""Signed approvals (docs/design.md, "The spend ledger and the budget"): with
SPILLWAY_APPROVAL_SECRET on the workers and on the approvers' machines, a decision carries an
HMAC-SHA256 over what it is for (`Binding`: the job id, the job's incarnation, and for an
approval the provider and the cost key of the clip), the decision, the approver, over-budget,
the reason and an expiry, and the workers use only a decision whose signature they can check.
Anyone who can signal the namespace (the Temporal UI's "Send a Signal" included) can send a
decision; only a holder of the secret can make one the workers take.

What it is for is signed but not carried: the spend ledger checks against the job the decision
reached, as Temporal describes it (its first run id survives resets and continue-as-new, and a
job id used again gets a new one) and the clip of that job's own input, so a decision signed for
one job, one incarnation, one provider or one price is worthless for any other. The expiry
bounds how long a decision read off a history could be sent again; the ledger takes each
signature for one create only (`digest`).

Pure: the caller gives the secret and the time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel

from spillway.core.models import ApprovalDecision

SIGNATURE_PREFIX = "v2,"
# Signatures of releases that bound the job id only: refused, the approver signs again.
OLD_PREFIX = "v1,"
# Enough for a decision to reach a running worker and be checked there; a decision sent as a
# signal while no worker runs must be used within it too, or be sent again.
DEFAULT_VALIDITY = timedelta(minutes=15)
# What the canonical form starts with: a signature over anything else spillway might sign one
# day (another message, another version of this one) never verifies as a decision.
_DOMAIN = "spillway-approval-v2"


class Binding(BaseModel):
    """What a decision is for. A rejection spends nothing: its provider and cost key are ""."""

    job_id: str
    incarnation: str  # Temporal's first run id of the job
    provider: str = ""
    cost_key: str = ""  # the key of the clip's figure in routing_tiers.json, e.g. "768P/6s"

    def of(self, decision: ApprovalDecision) -> Binding:
        """The binding as a decision of this kind signs it."""
        if decision.approved:
            return self
        return self.model_copy(update={"provider": "", "cost_key": ""})


def utc_text(moment: datetime) -> str:
    """An instant as the canonical form writes it; a naive time is taken as UTC."""
    aware = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return aware.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical(binding: Binding, decision: ApprovalDecision, expires_at: datetime) -> bytes:
    """The bytes that are signed. A JSON array: every field in a fixed place, every string
    escaped, so no two decisions share a form (`by="a", reason="b"` vs `by="a,b"`)."""
    bound = binding.of(decision)
    fields = [
        _DOMAIN,
        bound.job_id,
        bound.incarnation,
        bound.provider,
        bound.cost_key,
        decision.approved,
        decision.by,
        decision.over_budget,
        decision.reason,
        utc_text(expires_at),
    ]
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def signature(
    secret: str, binding: Binding, decision: ApprovalDecision, expires_at: datetime
) -> str:
    mac = hmac.new(secret.encode("utf-8"), canonical(binding, decision, expires_at), hashlib.sha256)
    return SIGNATURE_PREFIX + base64.b64encode(mac.digest()).decode("ascii")


def sign(
    secret: str,
    binding: Binding,
    decision: ApprovalDecision,
    now: datetime,
    valid_for: timedelta = DEFAULT_VALIDITY,
) -> ApprovalDecision:
    """`decision` signed for what `binding` names, good until `now + valid_for` (whole seconds,
    UTC)."""
    expires_at = (now.astimezone(UTC) + valid_for).replace(microsecond=0)
    return decision.model_copy(
        update={
            "expires_at": expires_at,
            "signature": signature(secret, binding, decision, expires_at),
        }
    )


def verify(secret: str, binding: Binding, decision: ApprovalDecision, now: datetime) -> str | None:
    """None when `decision` is signed with `secret` for what `binding` names and not expired at
    `now`; otherwise why not: "unsigned", "bad signature", "old signature" or "expired at <UTC
    time>"."""
    if decision.signature is None or decision.expires_at is None:
        return "unsigned"
    if decision.signature.startswith(OLD_PREFIX):
        return "old signature"
    expected = signature(secret, binding, decision, decision.expires_at)
    # Compared as bytes: a signature typed into the UI may hold characters that are not ASCII.
    if not hmac.compare_digest(expected.encode("ascii"), decision.signature.encode("utf-8")):
        return "bad signature"
    expires_at = decision.expires_at
    if expires_at.tzinfo is None:
        expires_at = expires_at.replace(tzinfo=UTC)
    if now >= expires_at:
        return f"expired at {expires_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    return None


def digest(decision: ApprovalDecision) -> str:
    """What the spend ledger records of a signature it took (never the signature itself)."""
    return hashlib.sha256((decision.signature or "").encode("utf-8")).hexdigest()[:32]
