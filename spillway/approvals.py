"""Signed approvals (docs/design.md, "The spend ledger and the budget"): with
SPILLWAY_APPROVAL_SECRET on the workers and on the approvers' machines, a decision carries an
HMAC-SHA256 over the job id, the decision, the approver, over-budget, the reason and an expiry,
and the workers use only a decision whose signature they can check. Anyone who can signal the
namespace (the Temporal UI's "Send a Signal" included) can send a decision; only a holder of the
secret can make one the workers take.

The job id is signed but not carried: the workers check against the id of the job the decision
reached, so a decision signed for one job is worthless for another. The expiry bounds how long a
decision read off a history could be sent again to the same job.

Pure: the caller gives the secret and the time.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
from datetime import UTC, datetime, timedelta

from spillway.models import ApprovalDecision

SIGNATURE_PREFIX = "v1,"
# Enough for a decision to reach a running worker and be checked there; a decision sent as a
# signal while no worker runs must be used within it too, or be sent again.
DEFAULT_VALIDITY = timedelta(minutes=15)
# What the canonical form starts with: a signature over anything else spillway might sign one
# day (another message, another version of this one) never verifies as a decision.
_DOMAIN = "spillway-approval-v1"


def utc_text(moment: datetime) -> str:
    """An instant as the canonical form writes it; a naive time is taken as UTC."""
    aware = moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)
    return aware.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def canonical(job_id: str, decision: ApprovalDecision, expires_at: datetime) -> bytes:
    """The bytes that are signed. A JSON array: every field in a fixed place, every string
    escaped, so no two decisions share a form (`by="a", reason="b"` vs `by="a,b"`)."""
    fields = [
        _DOMAIN,
        job_id,
        decision.approved,
        decision.by,
        decision.over_budget,
        decision.reason,
        utc_text(expires_at),
    ]
    return json.dumps(fields, ensure_ascii=False, separators=(",", ":")).encode("utf-8")


def signature(secret: str, job_id: str, decision: ApprovalDecision, expires_at: datetime) -> str:
    mac = hmac.new(secret.encode("utf-8"), canonical(job_id, decision, expires_at), hashlib.sha256)
    return SIGNATURE_PREFIX + base64.b64encode(mac.digest()).decode("ascii")


def sign(
    secret: str,
    job_id: str,
    decision: ApprovalDecision,
    now: datetime,
    valid_for: timedelta = DEFAULT_VALIDITY,
) -> ApprovalDecision:
    """`decision` signed for `job_id`, good until `now + valid_for` (whole seconds, UTC)."""
    expires_at = (now.astimezone(UTC) + valid_for).replace(microsecond=0)
    return decision.model_copy(
        update={
            "expires_at": expires_at,
            "signature": signature(secret, job_id, decision, expires_at),
        }
    )


def verify(secret: str, job_id: str, decision: ApprovalDecision, now: datetime) -> str | None:
    """None when `decision` is signed with `secret` for `job_id` and not expired at `now`;
    otherwise why not: "unsigned", "bad signature" or "expired at <UTC time>"."""
    if decision.signature is None or decision.expires_at is None:
        return "unsigned"
    expected = signature(secret, job_id, decision, decision.expires_at)
    # Compared as bytes: a signature typed into the UI may hold characters that are not ASCII.
    if not hmac.compare_digest(expected.encode("ascii"), decision.signature.encode("utf-8")):
        return "bad signature"
    expires_at = decision.expires_at
    if expires_at.tzinfo is None:
        expires_at = expires_at.replace(tzinfo=UTC)
    if now >= expires_at:
        return f"expired at {expires_at.astimezone(UTC):%Y-%m-%d %H:%M:%S} UTC"
    return None
