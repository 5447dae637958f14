"""AWAIT, the part of VideoJobWorkflow that waits for a person (docs/design.md, "The decision"):
the approval is asked for (the ledger read first, the owner notified), then the job waits for a
decision, the approval window's end or a GPU host's headroom, re-probing every recheck interval,
and continues as new when its history grows long. A decision arrives by the `approval` signal
(its raw payload read here, so that even an unreadable one is recorded, not dropped) or the
`decide_approval` update, and is refused, recorded, or used: a rejection runs the job locally,
an approval reserves its cost in the spend ledger. Before it is used a worker says whether its
signature holds (SPILLWAY_APPROVAL_SECRET, which the workflow never sees). Workflow code.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, NoReturn

from pydantic import ValidationError
from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, is_cancelled_exception

from workflows import activity_calls as calls
from workflows import admission, cloud_route, measure
from workflows.job_state import (
    ARMED,
    LOCAL,
    SIGNED_APPROVALS,
    RouteChoice,
    Ticket,
    VideoJobState,
    failure_message,
)

with workflow.unsafe.imports_passed_through():
    from activities.approvals import ApprovalCheck
    from spillway.core.decision import BUDGET_EXHAUSTED
    from spillway.core.models import (
        ApprovalDecision,
        ApprovalNotice,
        ApprovalRecord,
        AwaitCarry,
        IgnoredSignal,
    )
    from spillway.core.spend_book import APPROVAL_REFUSED
    from workflows import texts

MAX_IGNORED_SIGNALS = 20

# What the signal handler gets when a signal carried no input at all (the SDK decodes a handler's
# parameter only when its type is exactly RawValue, so "missing" is this empty payload).
NO_INPUT = RawValue(Payload())


# --- a decision arriving ---------------------------------------------------------------------


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


def refusal(s: VideoJobState, decision: ApprovalDecision) -> str | None:
    """Why the job cannot take this decision now, or None."""
    job_id = s.job.job_id
    if s.plan.state != "awaiting_approval":
        return f"job {job_id} is not awaiting approval (state: {s.plan.state})"
    if workflow.now() >= s.approval_deadline:
        return f"job {job_id}'s approval window closed at {s.approval_deadline:%H:%M:%S}"
    if s.pending is not None:
        return f"job {job_id} already has a decision by {s.pending.decision.by}"
    if decision.approved and s.job.cloud is None:
        return f"job {job_id} has no cloud prompt: it can only run locally"
    return None


def not_an_approver(s: VideoJobState, decision: ApprovalDecision) -> str | None:
    """Why an approval by someone the job's team does not list as an approver must not send it
    to the cloud (the teams file's `approvers`); None when the team lists them or lists nobody.
    A rejection spends nothing, so anyone may still keep a job local."""
    if not decision.approved:
        return None
    team = s.plan.team or s.policy.default_team
    approvers = s.policy.team_approvers.get(team)
    if approvers is None or decision.by in approvers:
        return None
    return texts.not_an_approver(s.job.job_id, decision.by, team, approvers)


def ignore(s: VideoJobState, ignored: IgnoredSignal) -> None:
    s.plan.ignored_signals = [*s.plan.ignored_signals, ignored][-MAX_IGNORED_SIGNALS:]
    s.ignored += 1
    workflow.logger.info("approval ignored: %s", ignored.why)
    s.publish()


def unused(s: VideoJobState, ticket: Ticket, why: str) -> None:
    """An accepted decision the job could not use: its caller hears why, the plan keeps it."""
    ticket.refusal = why
    ignore(s, IgnoredSignal(**ticket.decision.model_dump(), at=workflow.now(), why=why))


async def answer_open_decision(s: VideoJobState) -> None:
    """A decision accepted just as the job left its wait (headroom came back in the same moment)
    hears that it was not used, instead of Temporal's "workflow completed before the update
    completed"; the plan records it."""
    ticket = s.pending
    if ticket is None or ticket.settled:
        return
    unused(s, ticket, texts.ended_unused(s.job.job_id, s.plan.state))
    await workflow.wait_condition(workflow.all_handlers_finished)


# Runs of 0.5.0 say awaiting_approval before the budget is read: a person (or a script) could
# read a plan without its estimate.
BUDGET_WITH_STATE = "approval-budget-with-state"

# --- asking, and waiting ---------------------------------------------------------------------


async def ask(s: VideoJobState, because: str | None) -> RouteChoice:
    """AWAIT from the start: a job reset after its create follows the task the ledger recorded;
    any other job waits for a person, who is told why (`because`: what the cloud route said)."""
    recorded = await cloud_route.recorded_create(s)
    if recorded is not None:
        return recorded
    policy = s.policy
    now = workflow.now()
    if because is not None:
        s.reason(because)
    if because == BUDGET_EXHAUSTED:
        s.reason(texts.exhausted_by(s.plan.budget))
    deadline = now + timedelta(seconds=policy.approval_timeout_s)
    if workflow.patched(BUDGET_WITH_STATE):
        # Asked with the estimate and the budget: `spillway approve` reads the plan's provider
        # and clip the moment it says awaiting_approval.
        s.approval_deadline = deadline
        await cloud_route.read_budget(s)
        s.plan.state = "awaiting_approval"
        s.publish()
    else:
        s.plan.state = "awaiting_approval"
        s.publish()
        s.approval_deadline = deadline  # decisions arriving from now on are judged against it
        await cloud_route.read_budget(s)
    if policy.webhook_configured:
        notice = texts.approval_notice(s.plan, policy, workflow.info().namespace, deadline)
        s.notice = asyncio.create_task(_send_notice(notice))  # never awaited
    return await wait(s, deadline, now + timedelta(seconds=policy.unreachable_give_up_s))


async def wait(s: VideoJobState, approval_deadline: datetime, give_up_at: datetime) -> RouteChoice:
    if s.pooled:
        return await wait_in_line(s, approval_deadline, give_up_at)
    return await _wait_rechecking(s, approval_deadline, give_up_at)


async def wait_in_line(
    s: VideoJobState, approval_deadline: datetime | None = None, give_up_at: datetime | None = None
) -> RouteChoice:
    """In the GPU line until the first of: a place (LOCAL), an approval (CLOUD, it leaves the
    line), a cancel. A rejection or the approval window's end make it `queued`: it keeps its
    position and takes the next free place whatever the load. It holds no activity and no timer
    but the approval window's end, while no host answered the give-up, and its line check."""
    policy, now = s.policy, workflow.now()
    approval_deadline = approval_deadline or now
    give_up_at = give_up_at or now + timedelta(seconds=policy.unreachable_give_up_s)
    s.approval_deadline = approval_deadline
    if s.place is None:  # waits for a person since the cloud route said so: it joins the line
        await admission.ask(s, wait=True, mode="headroom")
    if s.plan.state != "awaiting_approval":
        s.plan.state = "queued"
    loops = 0
    # Runs of 0.6.0 on ask again every SPILLWAY_POOL_LINE_CHECK_S: a pool that ended (an
    # operator terminated it) would otherwise leave them waiting for ever.
    line_check = (
        timedelta(seconds=policy.pool_line_check_s)
        if workflow.patched(admission.LINE_CHECK)
        else None
    )
    checked = workflow.now()
    while True:
        if admission.admitted(s):
            if s.plan.state == "awaiting_approval":
                s.reason("headroom_returned")
            if s.pending is not None:  # arrived in the same moment: local wins
                unused(s, s.pending, texts.headroom_won())
                s.pending = None
            return LOCAL
        if s.pending is not None:
            choice = await _use(s, s.pending)
            if choice is not None:
                await admission.leave(s)
                return choice
            continue
        if s.patience_until is not None and s.late and workflow.now() < s.patience_until:
            # Told that the line's estimate puts its start after its patience: the cloud, once
            # the pool's own estimate of its own ask says so (the telling may be anyone's).
            s.late = False
            pool_says = await admission.confirm_late(s)
            if not pool_says.late:
                why = texts.late_not_confirmed(pool_says.lined, pool_says.position, pool_says.eta_s)
                ignore(s, IgnoredSignal(at=workflow.now(), why=why))
            if not pool_says.late or admission.admitted(s):  # a place came meanwhile: it wins
                continue
            left = (s.patience_until - workflow.now()).total_seconds()
            s.reason(texts.line_passed_patience(pool_says.eta_s, max(left, 0.0)))
            s.patience_until = s.plan.patience_until = None
            await admission.leave(s)
            return ARMED
        if s.patience_until is not None and workflow.now() >= s.patience_until:
            # An armed job whose patience ran out in line: the cloud (the line moves up).
            waited = (workflow.now() - s.place.asked_at).total_seconds() if s.place else 0.0
            s.reason(texts.waited_past_patience(waited))
            s.patience_until = s.plan.patience_until = None
            s.late = False
            await admission.leave(s)
            return ARMED
        if s.reprioritized:  # the same ask at its new priority: the pool moves it at once
            assert s.place is not None
            s.place = s.place.model_copy(update={"priority": s.job.priority})
            await admission.ask(s, wait=True, mode=s.place.mode, fresh=False)
            s.reprioritized = False
            continue
        now = workflow.now()
        if s.plan.state == "awaiting_approval" and now >= approval_deadline:
            s.reason("approval_timeout")
            s.plan.state = "queued"  # a timeout never means "spend"
        assert s.place is not None
        if s.plan.state == "queued" and s.place.mode != "any":
            await admission.ask(s, wait=True, mode="any", fresh=False)
            continue
        unreachable = s.plan.overflow.trigger == "unreachable"
        if unreachable and now >= give_up_at:
            cloud_asked = s.job.cloud is not None
            s.fail(texts.gave_up_waiting(policy.unreachable_give_up_s, s.plan, cloud_asked))
        s.publish()
        # Its history grows only by what it is sent (answers, decisions, ignored signals):
        # each of them wakes it, so a flood of signals still ends in continue-as-new.
        loops += 1
        if loops > policy.await_loops_per_run or workflow.info().is_continue_as_new_suggested():
            await workflow.wait_condition(
                lambda: (
                    (workflow.all_handlers_finished() and not s.strays)
                    or s.pending is not None
                    or s.reprioritized
                )
            )
            # A late answer is acted on here: the next run would not hear it again.
            late = s.late and s.patience_until is not None
            acted = s.pending is not None or s.reprioritized or late
            if not acted and not admission.admitted(s):
                _continue_as_new(s, approval_deadline, give_up_at)
            continue
        if line_check is not None and now - checked >= line_check:
            checked = now
            await admission.check(s)
            continue
        ends = [approval_deadline] if s.plan.state == "awaiting_approval" else []
        if s.patience_until is not None:
            ends.append(s.patience_until)
        if unreachable:
            ends.append(give_up_at)
        if line_check is not None:
            ends.append(checked + line_check)
        timeout = max(min(ends) - now, timedelta(seconds=1)) if ends else None
        await s.alarms.wait(_woken(s, s.ignored), timeout)


def _woken(s: VideoJobState, ignored: int) -> Callable[[], bool]:
    return lambda: (
        s.pending is not None
        or admission.admitted(s)
        or s.ignored != ignored
        or s.reprioritized
        or (s.late and s.patience_until is not None)
    )


async def _wait_rechecking(
    s: VideoJobState, approval_deadline: datetime, give_up_at: datetime
) -> RouteChoice:
    """Runs of 0.4.0: approval, rejection, timeout or headroom, re-probing every recheck
    interval. Once the approval window is over (state `probing`), wait only for ComfyUI."""
    policy = s.policy
    s.approval_deadline = approval_deadline
    s.publish()
    loops = 0
    while True:
        if s.pending is not None:
            choice = await _use(s, s.pending)
            if choice is not None:
                return choice
        now = workflow.now()
        if s.plan.state == "awaiting_approval" and now >= approval_deadline:
            s.reason("approval_timeout")
            s.plan.state = "probing"  # a timeout never means "spend"
        if s.plan.state == "probing" and measure.last_reachable(s):
            return LOCAL
        if now >= give_up_at:
            s.fail(texts.gave_up_waiting(policy.unreachable_give_up_s, s.plan))
        s.publish()

        loops += 1
        if loops > policy.await_loops_per_run or workflow.info().is_continue_as_new_suggested():
            await workflow.wait_condition(
                lambda: (workflow.all_handlers_finished() and not s.strays) or s.pending is not None
            )
            if s.pending is None:
                _continue_as_new(s, approval_deadline, give_up_at)

        recheck = timedelta(seconds=policy.approval_recheck_s)
        if s.plan.state == "awaiting_approval":
            recheck = max(min(recheck, approval_deadline - now), timedelta(seconds=1))
        try:
            await workflow.wait_condition(lambda: s.pending is not None, timeout=recheck)
            continue
        except TimeoutError:
            pass
        load = await measure.measure(s)
        if load.reachable and not load.overloaded:
            s.reason("headroom_returned")
            s.plan.overflow.last_signal = load
            if s.pending is not None:  # arrived while the probe ran: local wins
                unused(s, s.pending, texts.headroom_won())
                s.pending = None
            return LOCAL
        measure.note_load(s, load)


async def _use(s: VideoJobState, ticket: Ticket) -> RouteChoice | None:
    """The route a decision gives, its cost reserved; None when the job waits on (rejected:
    local as soon as ComfyUI answers; over the budget or not signed as the workers require:
    the person is told, the plan records it)."""
    decision = ticket.decision
    outsider = not_an_approver(s, decision)
    if outsider is not None:
        # Refused before anything is checked or reserved: recorded, and the job waits on.
        s.pending = None
        unused(s, ticket, outsider)
        return None
    # Still pending while its signature is checked: a second decision arriving meanwhile is
    # refused ("already has a decision"), never left queued behind it.
    signed, refused = await _checked(s, decision)
    s.pending = None
    if refused is not None:
        unused(s, ticket, refused)
        return None
    fields = decision.model_dump(exclude={"signature", "expires_at"})
    s.plan.approval = ApprovalRecord(**fields, at=workflow.now(), signed=signed)
    if not decision.approved:
        s.reason(f"rejected_by={decision.by}")
        s.plan.state = "queued" if s.pooled else "probing"
        ticket.answer = "rejected"
        return None
    over = decision.over_budget
    choice = RouteChoice(
        "cloud", authorisation="approved_over_budget" if over else "approved", by=decision.by
    )
    providers = s.policy.providers
    if not providers:
        ticket.refusal = texts.approved_without_key(decision.by)
        s.fail(ticket.refusal)
    reservation = await calls.spend_reserve(cloud_route.spend_request(s, choice, providers[0]))
    if reservation.refused is not None and reservation.refused_code == APPROVAL_REFUSED:
        # The ledger's own check of the signature, on the decision as this history holds it.
        s.plan.approval = None
        unused(s, ticket, texts.not_signed(s.job.job_id, reservation.refused))
        return None
    if reservation.refused is not None:
        ticket.refusal = texts.approved_without_key(decision.by)
        s.fail(ticket.refusal)
    if reservation.shortfall is not None:
        s.plan.approval = None
        s.plan.budget = texts.exhausted_view(s.plan.budget, reservation.shortfall)
        cloud_route.requote(s, choice, shortfall=reservation.shortfall)
        unused(s, ticket, texts.over_budget(reservation.shortfall, s.job.job_id))
        return None
    ticket.answer = "approved"
    return replace(choice, reservation=reservation)


async def _checked(s: VideoJobState, decision: ApprovalDecision) -> tuple[bool, str | None]:
    """(signed, why it must not be used): the workers hold SPILLWAY_APPROVAL_SECRET, so they
    say whether the decision is signed for this job; the workflow never sees the secret. Only
    the sender hears this early: the spend ledger checks the signature again before it grants
    anything (whoever can poll the job's queue could answer here)."""
    if not workflow.patched(SIGNED_APPROVALS):
        return False, None
    try:
        check = ApprovalCheck(
            job_id=s.job.job_id,
            decision=decision,
            incarnation=workflow.info().first_execution_run_id,
            provider=s.policy.providers[0] if s.policy.providers else "",
            request=s.job.cloud,
        )
        verdict = await calls.approval_verify(check)
    except ActivityError as err:
        if is_cancelled_exception(err):
            raise
        return False, texts.not_checked(s.job.job_id, failure_message(err))
    if not verdict.acceptable:
        return False, texts.not_signed(s.job.job_id, verdict.why or "refused")
    return verdict.signed, None


def _continue_as_new(
    s: VideoJobState, approval_deadline: datetime, give_up_at: datetime
) -> NoReturn:
    carry = AwaitCarry(
        plan=s.plan,
        policy=s.policy,
        approval_deadline=approval_deadline,
        give_up_at=give_up_at,
        pending_approval=s.pending.decision if s.pending else None,
        place=s.place,
        patience_until=s.patience_until,
    )
    workflow.continue_as_new(s.job.model_copy(update={"carry": carry}))


async def _send_notice(notice: ApprovalNotice) -> None:
    try:
        await calls.notify(notice)
    except ActivityError as err:
        # A failing webhook never blocks or fails the job; the UI and `list` still show it.
        workflow.logger.warning("approval webhook failed: %s", err.cause or err)
