"""`approval_verify`: whether a person's decision may be used, checked by a worker because the
workflow cannot hold the secret (workflow code reads no environment, and what it holds is in its
history). With SPILLWAY_APPROVAL_SECRET set only a decision signed with it for this job, and not
expired, is acceptable (spillway/approvals.py); without it every decision is, and anyone who can
signal the namespace can approve (`spillway health` says so)."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel
from temporalio import activity

from spillway import approvals, names
from spillway.models import ApprovalDecision
from spillway.settings import Settings


class ApprovalCheck(BaseModel):
    job_id: str  # the job the decision reached, never one the decision names
    decision: ApprovalDecision


class ApprovalVerdict(BaseModel):
    acceptable: bool
    signed: bool  # checked against the secret (False: the workers have none)
    why: str | None = None  # why not: "unsigned", "bad signature", "expired at ..."


class ApprovalActivities:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    @activity.defn(name=names.APPROVAL_VERIFY)
    async def verify(self, req: ApprovalCheck) -> ApprovalVerdict:
        secret = self._settings.SPILLWAY_APPROVAL_SECRET
        if secret is None:
            return ApprovalVerdict(acceptable=True, signed=False)
        why = approvals.verify(
            secret.get_secret_value(), req.job_id, req.decision, datetime.now(UTC)
        )
        if why is not None:
            activity.logger.warning(
                "approval refused job=%s by=%r approved=%s why=%s",
                req.job_id,
                req.decision.by,
                req.decision.approved,
                why,
            )
        return ApprovalVerdict(acceptable=why is None, signed=why is None, why=why)
