"""What VideoJobWorkflow needs to take a person's decision: the route a job takes and who allowed
it, a decision on its way through the workflow (a ticket the update waits on), and reading the
`approval` signal's raw payload so that even an unreadable one is recorded, not dropped.
Deterministic helpers only (workflow code)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue

with workflow.unsafe.imports_passed_through():
    from spillway.models import ApprovalDecision
    from spillway.spend_models import Authorisation, Reservation

# Patch ids (workflow.patched): histories recorded before the spend ledger replay without it.
PATCH_LEDGER = "spend-ledger-reserve"
PATCH_BUDGET_VIEW = "spend-ledger-budget-view"


# What the signal handler gets when a signal carried no input at all (the SDK decodes a handler's
# parameter only when its type is exactly RawValue, so "missing" is this empty payload).
NO_INPUT = RawValue(Payload())


@dataclass(frozen=True)
class RouteChoice:
    """Where a job goes and, for the cloud, who allowed it: `authorisation` says how (armed,
    approved, approved over the budget), `by` who ("armed" or the approver's name, as the
    JSON contract's `cloud.authorised_by` shows it)."""

    route: Literal["local", "cloud"]
    authorisation: Authorisation | None = None
    by: str | None = None
    reservation: Reservation | None = None

    @property
    def metric_label(self) -> str:
        if self.route == "local":
            return "none"
        return "armed" if self.authorisation == "armed" else "approved"


LOCAL = RouteChoice("local")
ARMED = RouteChoice("cloud", authorisation="armed", by="armed")


@dataclass
class Ticket:
    """A decision accepted by the signal or the update, until the workflow has used it (answer)
    or found it cannot (refusal); the update returns or raises what it ends with."""

    decision: ApprovalDecision
    answer: str | None = None
    refusal: str | None = None

    @property
    def settled(self) -> bool:
        return self.answer is not None or self.refusal is not None


def read_signal(raw: RawValue) -> ApprovalDecision | str:
    """The decision, or why it cannot be read (the Temporal UI sends whatever JSON was typed)."""
    if raw is NO_INPUT or not raw.payload.metadata:
        return "the approval signal carried no input"
    try:
        value: Any = workflow.payload_converter().from_payload(raw.payload)
    except Exception as exc:  # any converter error: the payload is not JSON
        return f"the approval signal's input is not JSON ({type(exc).__name__})"
    try:
        return ApprovalDecision.model_validate(value)
    except ValidationError as exc:
        fields = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or 'input'}: {e['msg']}" for e in exc.errors()
        )
        return f"the approval signal's input is not a decision ({fields})"


def raw_text(raw: RawValue, limit: int = 200) -> str | None:
    if raw is NO_INPUT:
        return None
    text = raw.payload.data.decode("utf-8", errors="replace")
    return text if len(text) <= limit else text[: limit - 3] + "..."
