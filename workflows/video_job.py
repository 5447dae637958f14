"""VideoJobWorkflow: measure, decide, maybe wait for a person, then render locally or in the cloud.

Deterministic: only models, the pure `decide`, the approval helpers and typed activity calls
(`workflows/calls.py`). Every measurement is an activity result, so the history shows why each
job went where it went; the plan is published as memo (readable without a worker), search
attributes (for lists) and current details (for the UI). Every cloud create is reserved in the
spend ledger first (docs/design.md, "The spend ledger and the budget").
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import (
    ActivityError,
    ApplicationError,
    is_cancelled_exception,
)

from workflows import calls
from workflows.approvals import (
    ARMED,
    LOCAL,
    NO_INPUT,
    RouteChoice,
    Ticket,
    raw_text,
    read_signal,
)
from workflows.callbacks import call_back
from workflows.cloud_route import KNOWN_PROVIDERS
from workflows.job_base import FAILED
from workflows.job_input import NAME, placeholder, read_job
from workflows.local_route import LocalRoute
from workflows.patches import PATCH_CALLBACKS, PATCH_POLICY_HERE
from workflows.waiting import Waiting

with workflow.unsafe.imports_passed_through():
    from spillway.callback_models import EventName
    from spillway.cloud_models import Provider
    from spillway.decision import decide
    from spillway.host_models import HostRef, Policy
    from spillway.models import (
        ApprovalDecision,
        IgnoredSignal,
        Plan,
        VideoJob,
    )

# Client-side names: the signal takes a raw payload (read in the handler) and the update is
# async, so the SDK cannot type calls made with the methods themselves.
APPROVAL_SIGNAL = "approval"
DECIDE_UPDATE = "decide_approval"


@workflow.defn(name=NAME)
class VideoJobWorkflow(Waiting, LocalRoute):
    @workflow.init
    def __init__(self, raw: RawValue) -> None:
        read = read_job(raw)
        self._input_error = read if isinstance(read, str) else None
        job = read if isinstance(read, VideoJob) else placeholder(workflow.info().workflow_id)
        self._job = job
        # `carry` is honoured only on a run continued by this workflow itself: a client that
        # starts a job with a hand-made one gets no shortcut past the probe and the approval.
        continued = workflow.info().continued_run_id is not None
        self._carry = job.carry if continued else None
        self._plan = self._carry.plan if self._carry else Plan(job_id=job.job_id)
        pending = self._carry.pending_approval if self._carry else None
        self._pending: Ticket | None = Ticket(pending) if pending else None
        self._deadline = self._carry.approval_deadline if self._carry else datetime.max
        self._published = "" if continued else self._published_at_start()
        self._notify_task: asyncio.Task[None] | None = None
        self._create_started = datetime.min
        self._unused_reservation = False  # reserved, and no create started for it yet
        self._heartbeat = timedelta(seconds=30)
        self._hosts: list[HostRef] = []
        self._providers: list[Provider] = ["minimax"]
        self._next_host: str | None = None
        self._callbacks = False  # the workers have a JOB_WEBHOOK_URL
        self._floor: bool | None = None  # PATCH_FLOOR, read at the run's first patch

    @workflow.run
    async def run(self, raw: RawValue) -> Plan:
        try:
            await self._run(self._job)
        except ApplicationError as err:
            if err.type == FAILED:
                await self._answer_open_decision()
                await self._tell("job.failed")
            raise
        except (asyncio.CancelledError, ActivityError):
            if self._plan.state == "cancelled":
                await self._answer_open_decision()
                await self._tell("job.cancelled")
            raise
        self._plan.progress = None
        self._set_state("completed")
        await self._answer_open_decision()
        await self._tell("job.completed")
        return self._plan

    async def _run(self, job: VideoJob) -> None:
        try:
            if self._input_error is not None:
                self._fail(self._input_error)
            if job.carry is not None and self._carry is None:
                self._fail("`carry` is set by continue-as-new only: start the job without it")
            if self._carry is not None:
                policy = self._carry.policy
            else:
                self._publish()
                if self._patched(PATCH_POLICY_HERE):
                    policy = await calls.read_policy_here(job.job_id)
                else:
                    policy = await calls.read_policy(job.job_id)
            # A dead worker's long activity moves to another worker after this (at most 30 s).
            self._heartbeat = timedelta(seconds=policy.heartbeat_timeout_s)
            self._hosts = policy.hosts
            self._callbacks = policy.job_webhook_configured
            # Jobs from before Kling know only MiniMax (and no ordered list of providers).
            known = [KNOWN_PROVIDERS[p] for p in policy.providers if p in KNOWN_PROVIDERS]
            self._providers = known or ["minimax"]
            choice = await self._route(job, policy)
            while choice.route == "cloud":
                wait_because = await self._run_cloud(policy, choice)
                if wait_because is None:
                    break
                choice = await self._await_person(policy, wait_because)
            if choice.route == "local":
                await self._run_local(policy)
        except (asyncio.CancelledError, ActivityError) as err:
            if isinstance(err, ActivityError) and not is_cancelled_exception(err):
                self._fail(self._failure_message(err))
            await self._cancel_local_prompt()
            await self._release_unused_reservation()
            self._set_state("cancelled")
            raise

    async def _tell(self, event: EventName) -> None:
        """The job's completion callback, when it or the workers name a receiver."""
        if not (self._job.callback_url or self._callbacks):
            return
        if self._patched(PATCH_CALLBACKS):
            await call_back(event, self._plan, self._job.callback_url)

    # --- queries, signals, updates -----------------------------------------------------------

    @workflow.query(name="plan")
    def plan(self) -> Plan:
        return self._plan

    @workflow.signal(name=APPROVAL_SIGNAL)
    def approval(self, raw: RawValue = NO_INPUT) -> None:
        """The Temporal UI's "Send a Signal" lands here. Whatever changes nothing (a job that is
        not waiting, input that is not a decision) is recorded in `ignored_signals`."""
        decision = read_signal(raw)
        if isinstance(decision, str):
            self._ignore(IgnoredSignal(at=workflow.now(), why=decision, raw=raw_text(raw)))
            return
        refusal = self._refusal(decision)
        if refusal is not None:
            self._ignore(IgnoredSignal(**decision.model_dump(), at=workflow.now(), why=refusal))
            return
        self._pending = Ticket(decision)

    @workflow.update(name=DECIDE_UPDATE)
    async def decide_approval(self, decision: ApprovalDecision) -> str:
        """`spillway approve|reject`: answers once the decision was used (or could not be: the
        budget, headroom that came back), so "approved" means the job goes to the cloud."""
        ticket = Ticket(decision)
        self._pending = ticket
        await workflow.wait_condition(lambda: ticket.settled)
        if ticket.refusal is not None:
            raise ApplicationError(ticket.refusal, type="ApprovalNotUsed", non_retryable=True)
        return ticket.answer or ""

    @decide_approval.validator
    def _validate_approval(self, decision: ApprovalDecision) -> None:
        refusal = self._refusal(decision)
        if refusal is not None:
            raise ValueError(refusal)

    # --- deciding ----------------------------------------------------------------------------

    async def _route(self, job: VideoJob, policy: Policy) -> RouteChoice:
        if self._carry is not None:
            carry = self._carry
            return await self._wait(policy, carry.approval_deadline, carry.give_up_at)
        load = await self._measure(policy)
        if not load.reachable:
            # One network blip never moves a job: "unreachable" needs a second silent probe.
            await workflow.sleep(timedelta(seconds=policy.unreachable_confirm_s))
            load = await self._measure(policy)
        armed = policy.armed_for(job.cloud is not None)
        decision = decide(load, armed=armed)
        workflow.logger.info(
            "decision job=%s route=%s trigger=%s armed=%s reasons=%s errors=%s why=%r",
            job.job_id,
            decision.route,
            decision.trigger,
            armed,
            ",".join(decision.reasons) or "-",
            len(load.errors),
            decision.why,
        )
        self._plan.reasons = decision.reasons
        self._plan.overflow.trigger = decision.trigger
        self._plan.overflow.last_signal = load if decision.trigger else None
        if decision.route == "local":
            return LOCAL
        if decision.route == "cloud":
            return ARMED
        return await self._await_person(policy, None)
