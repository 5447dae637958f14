"""`approval_verify`: whether a person's decision may be used, checked by a worker because the
workflow cannot hold the secret (workflow code reads no environment, and what it holds is in its
history). With SPILLWAY_APPROVAL_SECRET set only a decision signed with it for this job
incarnation, provider and clip, and not expired, is acceptable (spillway/core/approvals.py); without
it every decision is, and anyone who can signal the namespace can approve (`spillway health`
says so).

This answer only tells the sender early: it runs on the job's own task queue, and whoever can
poll that queue could answer "signed". Money never depends on it: the spend ledger's own vet
(activities/spend/vet.py) checks the signature again, on the decision as the job's history
holds it, before it grants a reservation."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel
from temporalio import activity

from activities.cloud import registry
from spillway.core import approvals, names
from spillway.core.models import ApprovalDecision, CloudRequest
from spillway.core.settings import Settings


class ApprovalCheck(BaseModel):
    job_id: str  # the job the decision reached, never one the decision names
    decision: ApprovalDecision
    # The job's first run id, the provider it would reserve and its clip: what an approval is
    # signed for (empty in runs that asked before approvals were bound to them).
    incarnation: str = ""
    provider: str = ""
    request: CloudRequest | None = None


class ApprovalVerdict(BaseModel):
    acceptable: bool
    signed: bool  # checked against the secret (False: the workers have none)
    why: str | None = None  # why not: "unsigned", "bad signature", "expired at ..."


def binding_of(
    job_id: str,
    incarnation: str,
    provider: str,
    request: CloudRequest | None,
    settings: Settings,
) -> approvals.Binding:
    cost_key = registry.cost_key(provider, request, settings) if request is not None else ""
    return approvals.Binding(
        job_id=job_id, incarnation=incarnation, provider=provider, cost_key=cost_key
    )


class ApprovalActivities:
    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    @activity.defn(name=names.APPROVAL_VERIFY)
    async def verify(self, req: ApprovalCheck) -> ApprovalVerdict:
        secret = self._settings.SPILLWAY_APPROVAL_SECRET
        if secret is None:
            return ApprovalVerdict(acceptable=True, signed=False)
        binding = binding_of(req.job_id, req.incarnation, req.provider, req.request, self._settings)
        why = approvals.verify(secret.get_secret_value(), binding, req.decision, datetime.now(UTC))
        if why is not None:
            activity.logger.warning(
                "approval refused job=%s by=%r approved=%s why=%s",
                req.job_id,
                req.decision.by,
                req.decision.approved,
                why,
            )
        return ApprovalVerdict(acceptable=why is None, signed=why is None, why=why)
