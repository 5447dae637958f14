"""A person's decision in VideoJobWorkflow: the route a job takes and who allowed it, a decision
on its way through the workflow (a ticket the update waits on), reading the `approval`
signal's raw payload so that even an unreadable one is recorded, not dropped, using a decision
(refused, recorded, or reserved in the spend ledger), and the webhook that asks for one.
Workflow code."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, Literal

from pydantic import ValidationError
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError

from workflows import calls
from workflows.job_base import JobBase
from workflows.patches import PATCH_ANSWER_AT_END, PATCH_LEDGER

with workflow.unsafe.imports_passed_through():
    from spillway.cloud_models import Provider
    from spillway.host_models import Policy
    from spillway.models import ApprovalDecision, ApprovalNotice, ApprovalRecord, IgnoredSignal
    from spillway.spend_models import Authorisation, Reservation
    from workflows import texts

MAX_IGNORED_SIGNALS = 20


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


class Approvals(JobBase):
    _providers: list[Provider]  # the cloud providers in order (the first is reserved first)

    """What the workflow does with a decision: refuse it, record it, or use it."""

    def _refusal(self, decision: ApprovalDecision) -> str | None:
        if self._plan.state != "awaiting_approval":
            return f"job {self._job.job_id} is not awaiting approval (state: {self._plan.state})"
        if workflow.now() >= self._deadline:
            return f"job {self._job.job_id}'s approval window closed at {self._deadline:%H:%M:%S}"
        if self._pending is not None:
            return f"job {self._job.job_id} already has a decision by {self._pending.decision.by}"
        if decision.approved and self._job.cloud is None:
            return f"job {self._job.job_id} has no cloud prompt: it can only run locally"
        return None

    def _ignore(self, ignored: IgnoredSignal) -> None:
        self._plan.ignored_signals = [*self._plan.ignored_signals, ignored][-MAX_IGNORED_SIGNALS:]
        workflow.logger.info("approval ignored: %s", ignored.why)
        self._publish()

    def _unused(self, ticket: Ticket, why: str) -> None:
        """An accepted decision the job could not use: its caller hears why, the plan keeps it."""
        ticket.refusal = why
        self._ignore(IgnoredSignal(**ticket.decision.model_dump(), at=workflow.now(), why=why))

    async def _answer_open_decision(self) -> None:
        """A decision accepted just as the job left its wait (headroom came back in the same
        moment) hears that it was not used, instead of Temporal's "workflow completed before the
        update completed"; the plan records it."""
        ticket = self._pending
        if ticket is None or ticket.settled or not self._patched(PATCH_ANSWER_AT_END):
            return
        self._unused(ticket, texts.ended_unused(self._job.job_id, self._plan.state))
        await workflow.wait_condition(workflow.all_handlers_finished)

    async def _use_decision(self, ticket: Ticket, policy: Policy) -> RouteChoice | None:
        decision = ticket.decision
        self._plan.approval = ApprovalRecord(**decision.model_dump(), at=workflow.now())
        if not decision.approved:
            self._plan.reasons = [*self._plan.reasons, f"rejected_by={decision.by}"]
            self._plan.state = "probing"  # rejected: local as soon as ComfyUI answers
            ticket.answer = "rejected"
            return None
        over = decision.over_budget
        choice = RouteChoice(
            "cloud", authorisation="approved_over_budget" if over else "approved", by=decision.by
        )
        if not self._patched(PATCH_LEDGER):
            if not policy.key_present:
                self._fail(texts.approved_without_key(decision.by))
            ticket.answer = "approved"
            return choice
        reservation = await calls.spend_reserve(self._spend_request(choice, self._providers[0]))
        if reservation.refused is not None:
            ticket.refusal = texts.approved_without_key(decision.by)
            self._fail(ticket.refusal)
        if reservation.shortfall is not None:
            self._plan.approval = None
            self._plan.budget = texts.exhausted_view(self._plan.budget, reservation.shortfall)
            self._unused(ticket, texts.over_budget(reservation.shortfall, self._job.job_id))
            return None
        ticket.answer = "approved"
        return replace(choice, reservation=reservation)

    async def _send_notice(self, notice: ApprovalNotice) -> None:
        try:
            await calls.notify(notice)
        except ActivityError as err:
            # A failing webhook never blocks or fails the job; the UI and `list` still show it.
            workflow.logger.warning("approval webhook failed: %s", err.cause or err)
