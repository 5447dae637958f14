"""VideoJobWorkflow: measure, decide, maybe wait for a person, then render locally or in the cloud.

Deterministic: only models, the pure `decide`, the approval helpers and typed activity calls
(`workflows/calls.py`). Every measurement is an activity result, so the history shows why each
job went where it went; the plan is published as memo (readable without a worker), search
attributes (for lists) and current details (for the UI). Every cloud create is reserved in the
spend ledger first (docs/design.md, "The spend ledger and the budget").
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any, Literal, NoReturn

from temporalio import workflow
from temporalio.common import RawValue, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.exceptions import TimeoutError as ActivityTimeout

from workflows import calls
from workflows.approvals import (
    ARMED,
    LOCAL,
    NO_INPUT,
    PATCH_BUDGET_VIEW,
    PATCH_LEDGER,
    RouteChoice,
    Ticket,
    raw_text,
    read_signal,
)

with workflow.unsafe.imports_passed_through():
    from activities import minimax as minimax_errors
    from activities.spend import NOT_ARMED, WRONG_WORLD
    from spillway import activity_names as names
    from spillway import search_attributes as sa
    from spillway.comfyui_models import (
        ComfyUICancel,
        ComfyUIDownload,
        ComfyUISubmit,
        ComfyUIWait,
        client_id_for,
        prompt_id_for,
    )
    from spillway.decision import decide
    from spillway.minimax_models import MiniMaxCreate, MiniMaxDownload, MiniMaxPoll
    from spillway.models import (
        ApprovalDecision,
        ApprovalNotice,
        ApprovalRecord,
        AwaitCarry,
        CloudInfo,
        IgnoredSignal,
        JobState,
        LoadStatus,
        Plan,
        Policy,
        VideoJob,
    )
    from spillway.spend_models import SpendEntry, SpendRequest, SpendSettle
    from workflows import texts
    from workflows.spend_ledger import REFUSED

MAX_IGNORED_SIGNALS = 20
# Client-side names: the signal takes a raw payload (read in the handler) and the update is
# async, so the SDK cannot type calls made with the methods themselves.
APPROVAL_SIGNAL = "approval"
DECIDE_UPDATE = "decide_approval"
DISARMED = "fallback_disarmed"  # the reason a job waits when armed spending is refused now
SettleState = Literal["charged", "maybe_charged", "released"]


@workflow.defn(name="VideoJobWorkflow")
class VideoJobWorkflow:
    @workflow.init
    def __init__(self, job: VideoJob) -> None:
        self._job = job
        # `carry` is honoured only on a run continued by this workflow itself: a client that
        # starts a job with a hand-made one gets no shortcut past the probe and the approval.
        continued = workflow.info().continued_run_id is not None
        self._carry = job.carry if continued else None
        self._plan = self._carry.plan if self._carry else Plan(job_id=job.job_id)
        pending = self._carry.pending_approval if self._carry else None
        self._pending: Ticket | None = Ticket(pending) if pending else None
        self._deadline = self._carry.approval_deadline if self._carry else datetime.max
        self._published = ""
        self._notify_task: asyncio.Task[None] | None = None
        self._create_started = datetime.min
        self._unused_reservation = False  # reserved, and no create started for it yet
        self._heartbeat = timedelta(seconds=30)

    @workflow.run
    async def run(self, job: VideoJob) -> Plan:
        try:
            if job.carry is not None and self._carry is None:
                self._fail("`carry` is set by continue-as-new only: start the job without it")
            if self._carry is not None:
                policy = self._carry.policy
            else:
                self._publish()
                policy = await calls.read_policy(job.job_id)
            # A dead worker's long activity moves to another worker after this (at most 30 s).
            self._heartbeat = timedelta(seconds=policy.heartbeat_timeout_s)
            choice = await self._route(job, policy)
            while choice.route == "cloud":
                wait_because = await self._run_cloud(policy, choice)
                if wait_because is None:
                    break
                choice = await self._await_person(policy, wait_because)
            if choice.route == "local":
                self._count(choice)
                await self._run_local(policy)
        except (asyncio.CancelledError, ActivityError) as err:
            if isinstance(err, ActivityError) and not is_cancelled_exception(err):
                self._fail(self._failure_message(err))
            await self._cancel_local_prompt()
            await self._release_unused_reservation()
            self._set_state("cancelled")
            raise
        self._plan.progress = None
        self._set_state("completed")
        return self._plan

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

    # --- deciding ----------------------------------------------------------------------------

    async def _route(self, job: VideoJob, policy: Policy) -> RouteChoice:
        if self._carry is not None:
            carry = self._carry
            return await self._wait(policy, carry.approval_deadline, carry.give_up_at)
        load = await calls.probe(job.job_id)
        if not load.reachable:
            # One network blip never moves a job: "unreachable" needs a second silent probe.
            await workflow.sleep(timedelta(seconds=policy.unreachable_confirm_s))
            load = await calls.probe(job.job_id)
        armed = policy.armed and job.cloud is not None
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

    async def _await_person(self, policy: Policy, because: str | None) -> RouteChoice:
        now = workflow.now()
        if because is not None:
            self._plan.reasons = [*self._plan.reasons, because]
        self._plan.state = "awaiting_approval"
        deadline = now + timedelta(seconds=policy.approval_timeout_s)
        self._deadline = deadline  # decisions arriving from now on are judged against it
        if self._job.cloud is not None and workflow.patched(PATCH_BUDGET_VIEW):
            exhausted = self._plan.budget.exhausted if self._plan.budget else None
            try:
                view = await calls.spend_view(self._spend_request(ARMED))
                self._plan.budget = view.model_copy(update={"exhausted": exhausted})
            except ActivityError as err:
                workflow.logger.warning("budget view failed: %s", err.cause or err)
        if policy.webhook_configured:
            notice = texts.approval_notice(self._plan, policy, workflow.info().namespace, deadline)
            self._notify_task = asyncio.create_task(self._send_notice(notice))  # never awaited
        return await self._wait(
            policy,
            approval_deadline=deadline,
            give_up_at=now + timedelta(seconds=policy.unreachable_give_up_s),
        )

    async def _wait(
        self, policy: Policy, approval_deadline: datetime, give_up_at: datetime
    ) -> RouteChoice:
        """AWAIT: approval, rejection, timeout or headroom, re-probing every recheck interval.
        Once the approval window is over (state `probing`), wait only for ComfyUI to answer."""
        self._deadline = approval_deadline
        self._publish()
        loops = 0
        while True:
            if self._pending is not None:
                ticket, self._pending = self._pending, None
                choice = await self._use_decision(ticket, policy)
                if choice is not None:
                    return choice
            now = workflow.now()
            if self._plan.state == "awaiting_approval" and now >= approval_deadline:
                self._plan.reasons = [*self._plan.reasons, "approval_timeout"]
                self._plan.state = "probing"  # a timeout never means "spend"
            if self._plan.state == "probing" and self._last_reachable():
                return LOCAL
            if now >= give_up_at:
                self._fail(texts.gave_up_waiting(policy.unreachable_give_up_s, self._plan))
            self._publish()

            loops += 1
            if loops > policy.await_loops_per_run or workflow.info().is_continue_as_new_suggested():
                await workflow.wait_condition(
                    lambda: workflow.all_handlers_finished() or self._pending is not None
                )
                if self._pending is None:
                    self._continue_as_new(policy, approval_deadline, give_up_at)

            wait = timedelta(seconds=policy.approval_recheck_s)
            if self._plan.state == "awaiting_approval":
                wait = max(min(wait, approval_deadline - now), timedelta(seconds=1))
            try:
                await workflow.wait_condition(lambda: self._pending is not None, timeout=wait)
                continue
            except TimeoutError:
                pass
            load = await calls.probe(self._job.job_id)
            if load.reachable and not load.overloaded:
                self._plan.reasons = [*self._plan.reasons, "headroom_returned"]
                self._plan.overflow.last_signal = load
                if self._pending is not None:  # arrived while the probe ran: local wins
                    self._unused(self._pending, texts.headroom_won())
                    self._pending = None
                return LOCAL
            self._note_load(load)

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
        if not workflow.patched(PATCH_LEDGER):
            if not policy.key_present:
                self._fail(texts.approved_without_key(decision.by))
            ticket.answer = "approved"
            return choice
        reservation = await calls.spend_reserve(self._spend_request(choice))
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

    def _continue_as_new(
        self, policy: Policy, approval_deadline: datetime, give_up_at: datetime
    ) -> NoReturn:
        carry = AwaitCarry(
            plan=self._plan,
            policy=policy,
            approval_deadline=approval_deadline,
            give_up_at=give_up_at,
            pending_approval=self._pending.decision if self._pending else None,
        )
        workflow.continue_as_new(self._job.model_copy(update={"carry": carry}))

    def _note_load(self, load: LoadStatus) -> None:
        """Keeps the latest measurement that explains why the job still waits."""
        self._plan.overflow.last_signal = load
        if load.reachable and self._plan.overflow.trigger == "unreachable":
            self._plan.overflow.trigger = "overloaded"

    def _last_reachable(self) -> bool:
        load = self._plan.overflow.last_signal
        return load is None or load.reachable

    async def _send_notice(self, notice: ApprovalNotice) -> None:
        try:
            await calls.notify(notice)
        except ActivityError as err:
            # A failing webhook never blocks or fails the job; the UI and `list` still show it.
            workflow.logger.warning("approval webhook failed: %s", err.cause or err)

    # --- LOCAL ---------------------------------------------------------------------------------

    async def _run_local(self, policy: Policy) -> None:
        self._plan.route = "local"
        client_id = client_id_for(self._job.job_id)
        while self._plan.local_attempts < policy.comfyui_max_attempts:
            self._plan.local_attempts += 1
            prompt_id = prompt_id_for(self._job.job_id, self._plan.local_attempts)
            self._plan.prompt_id = prompt_id
            self._set_state("running_local")
            submit = ComfyUISubmit(
                job_id=self._job.job_id,
                prompt_id=prompt_id,
                client_id=client_id,
                graph=self._job.graph,
            )
            await calls.comfyui_submit(submit, self._heartbeat)
            wait = ComfyUIWait(job_id=self._job.job_id, prompt_id=prompt_id, client_id=client_id)
            finished = await calls.comfyui_wait(wait, self._heartbeat)
            if finished.outcome == "lost":
                # ComfyUI restarted and forgot the prompt: resubmitting locally costs nothing.
                self._plan.reasons = [*self._plan.reasons, f"comfyui_lost_prompt={prompt_id}"]
                continue
            download = ComfyUIDownload(job_id=self._job.job_id, files=finished.files)
            self._plan.outputs = (await calls.comfyui_download(download, self._heartbeat)).outputs
            return
        self._fail(texts.lost_too_often(self._plan.local_attempts))

    async def _cancel_local_prompt(self) -> None:
        if self._plan.route != "local" or self._plan.prompt_id is None:
            return
        # A job shows `cancelled` only once ComfyUI no longer holds its prompt.
        cancel = ComfyUICancel(prompt_id=self._plan.prompt_id)
        cancelled = await calls.comfyui_cancel(cancel, self._heartbeat)
        self._plan.reasons = [*self._plan.reasons, f"comfyui_prompt_{cancelled.was}_cancelled"]

    # --- CLOUD ---------------------------------------------------------------------------------

    async def _run_cloud(self, policy: Policy, choice: RouteChoice) -> str | None:
        """Reserves (unless the approval did), creates once, polls, downloads. Returns why the
        job must wait for a person instead (the budget, a disarmed fallback), else None."""
        request = self._job.cloud
        if request is None:  # decide() and the approval checks make this unreachable
            self._fail(f"job {self._job.job_id} has no cloud prompt: it can only run locally")
        reservation = choice.reservation
        if reservation is None and workflow.patched(PATCH_LEDGER):
            reservation = await calls.spend_reserve(self._spend_request(choice))
            if reservation.shortfall is not None:
                self._plan.budget = texts.exhausted_view(self._plan.budget, reservation.shortfall)
                return "budget_exhausted"
            if reservation.refused is not None:
                return reservation.refused_code or DISARMED
        cost = policy.estimated_costs_usd.get(f"{request.resolution}/{request.duration}s")
        if reservation is not None and reservation.granted is not None:
            cost = reservation.granted.cost_usd
        self._plan.route = "cloud"
        self._plan.cloud = CloudInfo(
            authorised_by=choice.by or "armed",
            authorisation=choice.authorisation,
            estimated_cost_usd=cost,
        )
        self._count(choice)
        self._set_state("running_cloud")
        self._unused_reservation = reservation is not None and reservation.granted is not None
        existing = reservation.existing if reservation else None
        if existing is not None:
            task_id = self._follow(existing)
        else:
            create = MiniMaxCreate(
                job_id=self._job.job_id,
                request=request,
                authorisation=choice.authorisation or "armed",
                simulated=policy.simulated,
            )
            task_id = await self._create(create)
            if task_id == DISARMED:
                return DISARMED
        self._plan.cloud.task_id = task_id
        self._publish()
        done = await calls.minimax_poll(
            MiniMaxPoll(job_id=self._job.job_id, task_id=task_id), self._heartbeat
        )
        download = MiniMaxDownload(job_id=self._job.job_id, task_id=task_id, file_id=done.file_id)
        self._plan.outputs = (await calls.minimax_download(download, self._heartbeat)).outputs
        return None

    async def _create(self, req: MiniMaxCreate) -> str:
        """The task id, or DISARMED when the fallback was disarmed before anything was sent."""
        self._create_started = workflow.now()
        handle = calls.minimax_create(req, self._heartbeat)
        self._unused_reservation = False  # the create's own guard settles it from here
        try:
            created = await asyncio.shield(handle)
        except asyncio.CancelledError:
            # A create once scheduled is never abandoned: the job ends cancelled, but only after
            # recording what it ordered (a task that will be charged).
            try:
                ordered = await handle
            except ActivityError as err:
                self._plan.error = self._failure_message(err)
                raise asyncio.CancelledError() from None
            assert self._plan.cloud is not None
            self._plan.cloud.task_id = ordered.task_id
            self._plan.reasons = [*self._plan.reasons, f"cancelled_after_create={ordered.task_id}"]
            self._plan.error = texts.cancelled_after_create(ordered.task_id)
            if not ordered.settled:
                await self._settle("charged", ordered.task_id)
            raise
        except ActivityError as err:
            return await self._create_failed(err)
        if not created.settled:
            await self._settle("charged", created.task_id)
        return created.task_id

    async def _create_failed(self, err: ActivityError) -> str:
        cause = err.cause
        kind = cause.type if isinstance(cause, ApplicationError) else None
        if kind in (NOT_ARMED, WRONG_WORLD, minimax_errors.NO_KEY):
            await self._settle("released", None)  # nothing was sent
            if kind == NOT_ARMED:
                return DISARMED
            self._fail(self._failure_message(err))
        if kind == REFUSED and isinstance(cause, ApplicationError):
            details = cause.details[0] if cause.details else {}
            entry = details.get("entry") if isinstance(details, dict) else None
            if entry:
                return self._follow(SpendEntry.model_validate(entry))
            self._fail(cause.message)
        if isinstance(cause, ActivityTimeout):
            # The worker was lost during the create: did it begin? The ledger knows.
            entry = await self._settle("maybe_charged", None)
            if entry is not None and entry.state == "released":
                self._fail(texts.create_never_began(self._plan))
        self._fail(self._failure_message(err))

    async def _release_unused_reservation(self) -> None:
        """A job cancelled between its reservation and its create gives the money back."""
        if self._unused_reservation:
            self._unused_reservation = False
            await self._settle("released", None)

    def _follow(self, entry: SpendEntry) -> str:
        """A run that finds its job already charged follows the recorded task, never creates."""
        if entry.state != "charged" or not entry.task_id or entry.provider != "minimax":
            self._fail(texts.create_exists(self._plan, entry))
        self._plan.reasons = [*self._plan.reasons, f"followed_recorded_task={entry.task_id}"]
        return entry.task_id

    async def _settle(self, state: SettleState, task_id: str | None) -> SpendEntry | None:
        settle = SpendSettle(job_id=self._job.job_id, state=state, task_id=task_id)
        return await calls.spend_settle(settle)

    def _spend_request(self, choice: RouteChoice) -> SpendRequest:
        request = self._job.cloud
        assert request is not None
        return SpendRequest(
            job_id=self._job.job_id,
            provider="minimax",
            resolution=request.resolution,
            duration=request.duration,
            authorised_by=choice.by or "armed",
            authorisation=choice.authorisation or "armed",
        )

    # --- what people see -------------------------------------------------------------------------

    def _count(self, choice: RouteChoice) -> None:
        workflow.metric_meter().create_counter(
            "spillway_jobs_routed", "jobs by the route they took and who allowed the cloud"
        ).add(1, {"route": choice.route, "authorised": choice.metric_label})

    def _set_state(self, state: JobState) -> None:
        self._plan.state = state
        self._publish()

    def _publish(self) -> None:
        plan = self._plan
        snapshot = plan.model_dump_json()
        if snapshot == self._published:  # every upsert is a history event: skip no-ops
            return
        self._published = snapshot
        updates: list[SearchAttributeUpdate[Any]] = [sa.STATE.value_set(plan.state)]
        if plan.route is not None:
            updates.append(sa.ROUTE.value_set(plan.route))
        if plan.overflow.trigger is not None:
            updates.append(sa.TRIGGER.value_set(plan.overflow.trigger))
        if plan.overflow.last_signal is not None:
            updates.append(sa.OVERLOADED.value_set(plan.overflow.last_signal.overloaded))
        workflow.upsert_search_attributes(updates)
        workflow.upsert_memo({"plan": plan})
        workflow.set_current_details(texts.current_details(plan))

    def _fail(self, message: str) -> NoReturn:
        self._plan.error = message
        self._set_state("failed")
        raise ApplicationError(message, type="JobFailed", non_retryable=True)

    def _failure_message(self, err: ActivityError) -> str:
        cause = err.cause
        if err.activity_type == names.MINIMAX_CREATE and isinstance(cause, ActivityTimeout):
            return texts.ambiguous_create(self._plan, self._create_started)
        if isinstance(cause, ApplicationError | ActivityTimeout):
            return cause.message
        return str(cause or err)
