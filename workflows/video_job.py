"""VideoJobWorkflow: measure, decide, maybe wait for a person, then render locally or in the cloud
(docs/design.md, "The workflow").

Deterministic: only models, the pure `decide` and typed activity calls. Every measurement is an
activity result, so the history shows why each job went where it went; the plan is published
as memo (readable without a worker), search attributes (for lists) and current details (for the
UI). Every cloud create is reserved in the spend ledger first. The job's state is one
`VideoJobState`; the routes are functions over it (local_route.py, cloud_route.py, and
approval.py for the wait for a person).
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RawValue
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

from workflows import activity_calls as calls
from workflows import admission, approval, cloud_route, local_route, measure
from workflows.callback import call_back
from workflows.job_state import (
    ARMED,
    FAILED,
    LOCAL,
    RouteChoice,
    Ticket,
    VideoJobState,
    failure_message,
)

with workflow.unsafe.imports_passed_through():
    from activities.callbacks import EventName
    from activities.comfyui.models import HostFit
    from spillway.core import names
    from spillway.core.decision import (
        Line,
        Seen,
        Verdict,
        is_armed,
        patience_s,
        places_taken,
        route,
    )
    from spillway.core.gpu_pool import PoolAnswer
    from spillway.core.models import (
        MAX_PRIORITY_CHANGES,
        ApprovalDecision,
        CancelNote,
        CancelRecord,
        IgnoredSignal,
        JobPlace,
        PlaceMode,
        Plan,
        PriorityChange,
        PriorityRecord,
        QueueSpot,
        RenderProgress,
    )
    from workflows import texts

SHOWN_LACKS = 5  # what a host lacks, shown in the plan: the first few phrases


def _line(answer: PoolAnswer) -> Line:
    """The pool's answer as the decision reads it: a place now, or where it stands (or would
    stand: an ask that does not wait) in the line."""
    if answer.host is not None:
        return Line(host=answer.host, eta_s=0.0, full=answer.full)
    return Line(
        position=answer.position or answer.would_be or 0,
        eta_s=answer.eta_s,
        render_s=answer.render_s,
        full=answer.full,
    )


@workflow.defn(name=names.VIDEO_JOB)
class VideoJobWorkflow:
    @workflow.init
    def __init__(self, raw: RawValue) -> None:
        self._state = VideoJobState.of(raw)
        self._strays: asyncio.Task[None] | None = None

    @workflow.run
    async def run(self, raw: RawValue) -> Plan:
        s = self._state
        self._strays = asyncio.create_task(self._give_back_strays())
        try:
            await self._route_and_render()
        except ApplicationError as err:
            if err.type == FAILED:
                await self._ended("job.failed")
            raise
        except (asyncio.CancelledError, ActivityError):
            if s.plan.state == "cancelled":
                await self._ended("job.cancelled")
            raise
        s.plan.progress = None
        s.set_state("completed")
        await self._ended("job.completed")
        return s.plan

    async def _route_and_render(self) -> None:
        s = self._state
        try:
            if s.input_error is not None:
                s.fail(s.input_error)
            if s.carry is None:
                s.publish()
                s.pooled = workflow.patched(admission.GPU_POOL)
                s.worker_policy = await calls.read_policy(s.job.job_id, local=not s.pooled)
                s.plan.team = s.job.team or s.worker_policy.default_team
                shares = s.worker_policy.team_shares
                if shares and s.plan.team not in shares:  # started around the CLI's check
                    s.fail(texts.no_such_team(s.plan.team, list(shares)))
                choice = await self._decide()
            else:
                choice = await approval.wait(s, s.carry.approval_deadline, s.carry.give_up_at)
            while True:
                while choice.route == "cloud":
                    wait_because = await cloud_route.run(s, choice)
                    if wait_because is None:
                        break
                    choice = await approval.ask(s, wait_because)
                if choice.route == "cloud":
                    break
                try:
                    host_lost = await local_route.run(s)
                except local_route.Preempted:
                    await admission.let_go(s)
                    choice = await self._decide()  # back in line at its first ask time
                    continue
                except local_route.PlaceTaken as taken:
                    choice = await self._decide()  # a new ask: a place, the line, or the cloud
                    s.reason(f"place_taken={taken}")
                    continue
                if not host_lost:
                    break
                await admission.leave(s)
                choice = ARMED  # its host was lost under it, and the job is armed
        except (asyncio.CancelledError, ActivityError) as err:
            if isinstance(err, ActivityError) and not is_cancelled_exception(err):
                s.fail(failure_message(err))
            await local_route.cancel_prompt(s)
            await cloud_route.release_unused(s)
            s.set_state("cancelled")
            raise

    async def _decide(self) -> RouteChoice:
        s = self._state
        policy, job = s.policy, s.job
        if s.pooled and s.unfit is None and policy.host_fit:
            # Asked alongside the first measurement: the job waits for the slower of the two.
            found, _ = await asyncio.gather(measure.fits(s), measure.measure(s))
            self._keep_unfit_hosts(found)
            load = measure.pick(s)
        else:
            load = await measure.measure(s)
        if not load.reachable:
            # One network blip never moves a job: "unreachable" needs a second silent probe.
            await workflow.sleep(timedelta(seconds=policy.unreachable_confirm_s))
            load = await measure.measure(s)
        armed = is_armed(policy.fallback_enabled, policy.key_present, job.cloud is not None)
        # An armed job with patience lines up for the next place while the line's estimate is
        # within it; without, it overflows as soon as the places are full.
        patience = patience_s(job, policy.overflow_after_s, workflow.now()) if armed else None
        seen = Seen(
            load=load,
            armed=armed,
            has_cloud=job.cloud is not None,
            hosts=tuple(h.name for h in policy.hosts),
            unfit=tuple(s.unfit or ()),
            patience_s=patience,
            by_deadline=job.deadline is not None,
        )
        verdict = route(seen)
        answer: PoolAnswer | None = None
        waits_patiently, patience_reason = False, None
        if s.pooled and verdict.route != "cloud":
            # A job that may still go to the cloud waits for headroom; one that can only run
            # here, or that waits by its patience, takes the next place on a host that answers.
            mode: PlaceMode = "any" if job.cloud is None or patience is not None else "headroom"
            start_by = None
            if patience is not None:
                start_by = job.deadline or workflow.now() + timedelta(seconds=patience)
            answer = await admission.ask(
                s,
                wait=not armed or patience is not None,
                mode=mode,
                start_by=start_by,
                by_deadline=job.deadline is not None,
            )
            if answer.refused is not None:  # its team's waiting limit: nothing reached a host
                s.fail(answer.refused)
            seen = replace(seen, line=_line(answer))
            verdict = route(seen)
            if answer.host is None:
                load = places_taken(load, answer.full)
                if verdict.patience_s is not None and answer.position is not None:
                    waits_patiently, patience_reason, eta = await self._by_patience(answer, verdict)
                    if eta != answer.eta_s:
                        # The pool's own estimate for the job's ask, not the answer's word.
                        seen = replace(seen, line=_line(answer.model_copy(update={"eta_s": eta})))
                        verdict = route(seen)
        decision = verdict.decision
        line = texts.decision_line(
            job.job_id,
            decision,
            armed,
            len(load.errors),
            has_cloud=job.cloud is not None,
            patient=waits_patiently,
            why=verdict.why,
        )
        workflow.logger.info("%s", line)
        s.plan.reasons = decision.reasons
        s.plan.reasons += [f"cannot_run_on={name}" for name in s.unfit or []]
        s.plan.reasons += [patience_reason] if patience_reason else []
        if s.plan.preempted is not None:
            s.plan.reasons.append(f"preempted_by_{s.plan.preempted.by}")
        s.plan.overflow.trigger = decision.trigger
        s.plan.overflow.last_signal = load if decision.trigger else None
        s.seen = seen
        if policy.job_quote:
            s.plan.quote = cloud_route.quote_of(s, verdict)
        if waits_patiently:
            return await approval.wait_in_line(s)
        if decision.route == "cloud":
            await admission.leave(s)  # an ask it kept when a place was not its own
            return ARMED
        if answer is None:  # a run of 0.4.0
            return LOCAL if decision.route == "local" else await approval.ask(s, None)
        if admission.admitted(s):
            return LOCAL
        if job.cloud is None:  # nobody is asked: it waits for a place
            return await approval.wait_in_line(s)
        return await approval.ask(s, None)

    async def _by_patience(
        self, answer: PoolAnswer, verdict: Verdict
    ) -> tuple[bool, str, float | None]:
        """In line with its patience: it waits when the line's estimate is within it or not
        known yet (until then), else it leaves the line at once for the cloud, once the pool
        itself confirms that its ask is late (the answer may be anyone's signal); the reason
        names both figures, and the estimate the job acts on is returned with it. With a
        deadline the patience leaves a typical render's time before it (`route`)."""
        s = self._state
        patience = verdict.patience_s or 0.0
        if verdict.patient:
            if answer.eta_s is None:
                # No render seen yet (a pool started after a terminate forgot them): an
                # estimate nobody has never spends; its patience's timer does, once it is out.
                reason = texts.line_unknown_within_patience(patience)
            else:
                reason = texts.line_within_patience(answer.eta_s, patience)
            return await self._wait_patiently(patience), reason, answer.eta_s
        s.late = False  # its answer said so; the pool's own estimate decides
        checked = await admission.confirm_late(s) if answer.eta_s is not None else None
        if checked is not None and not checked.late:
            why = texts.late_not_confirmed(checked.lined, checked.position, checked.eta_s)
            approval.ignore(s, IgnoredSignal(at=workflow.now(), why=why))
            if checked.eta_s is None:
                reason = texts.line_unknown_within_patience(patience)
            else:
                reason = texts.line_within_patience(checked.eta_s, patience)
            return await self._wait_patiently(patience), reason, checked.eta_s
        await admission.leave(s)
        eta = checked.eta_s if checked is not None else None
        return False, texts.line_past_patience(eta, patience), eta

    async def _wait_patiently(self, patience: float) -> bool:
        s = self._state
        until = workflow.now() + timedelta(seconds=patience)
        await cloud_route.read_budget(s)  # what the cloud would cost now, for people
        s.patience_until = s.plan.patience_until = until
        return True

    async def _give_back_strays(self) -> None:
        s = self._state
        while True:
            await workflow.wait_condition(lambda: bool(s.strays))
            await admission.give_back(s, s.strays[0])
            s.strays.pop(0)  # after it is sent: a continue-as-new waits for none to be left

    def _keep_unfit_hosts(self, found: dict[str, HostFit]) -> None:
        """The hosts that can run the job's graph; none: the job fails before anything is
        posted or spent, naming per host what it lacks."""
        s = self._state
        s.unfit = [name for name, fit in found.items() if fit.missing]
        s.plan.can_run = [name for name, fit in found.items() if not fit.missing]
        s.plan.cannot_run = {
            n: fit.missing[:SHOWN_LACKS] for n, fit in found.items() if fit.missing
        }
        s.hosts_have = {name: fit.host for name, fit in found.items() if fit.host is not None}
        if len(s.unfit) == len(found):
            s.fail(texts.no_host_can_run({name: fit.missing for name, fit in found.items()}))

    async def _ended(self, event: EventName) -> None:
        """An accepted decision the job never used hears so; then the job's completion callback,
        when it or the workers name a receiver."""
        s = self._state
        await admission.leave(s)
        if s.strays:
            await workflow.wait_condition(lambda: not s.strays)
        await approval.answer_open_decision(s)
        webhook = s.worker_policy is not None and s.worker_policy.job_webhook_configured
        if s.job.callback_url or webhook:
            await call_back(event, s.plan, s.job.callback_url)

    # --- queries, signals, updates -----------------------------------------------------------

    @workflow.query(name=names.PLAN_QUERY)
    def plan(self) -> Plan:
        return self._state.plan

    @workflow.query(name=names.JOB_PLACE)
    def pool_place(self) -> JobPlace | None:
        return self._state.place

    @workflow.signal(name=names.POOL_ANSWER)
    async def pool_answer(self, answer: PoolAnswer) -> None:
        """The GPU pool's answer. A place given to an ask the job no longer stands by goes
        back, sent by the run."""
        s = self._state
        if admission.take(s, answer):
            if answer.late and (s.place is None or s.place.start_by is None):
                why = texts.late_not_its_ask(answer.asked_at, patient=False)
                approval.ignore(s, IgnoredSignal(at=workflow.now(), why=why))
            return
        if answer.late:  # to no ask of this job's: nothing to confirm
            why = texts.late_not_its_ask(answer.asked_at, patient=True)
            approval.ignore(s, IgnoredSignal(at=workflow.now(), why=why))
        if answer.host is None:
            return
        if workflow.patched(admission.STRAYS_BY_RUN):
            s.strays.append(answer.asked_at)
        else:
            await admission.give_back(s, answer.asked_at)

    @workflow.signal(name=names.RENDER_PROGRESS_SIGNAL)
    def render_progress(self, news: RenderProgress) -> None:
        """Its ComfyUI wait's relay, for the UI's current details alone (status and watch read
        the wait's heartbeats): no plan change, no memo upsert."""
        s = self._state
        if s.plan.state == "running_local" and news.prompt_id == s.plan.prompt_id:
            s.progress = news
            workflow.set_current_details(texts.current_details(s.plan, news))

    @workflow.signal(name=names.CANCEL_NOTE_SIGNAL)
    def cancel_note(self, note: CancelNote) -> None:
        """Who cancels the job and why, for its plan: published with `cancelled` (or at the next
        change), so it sends no command of its own and a history before it replays as it was."""
        s = self._state
        if s.plan.state not in ("completed", "failed", "cancelled"):
            s.plan.cancelled_by = CancelRecord(**note.model_dump(), at=workflow.now())

    @workflow.signal(name=names.APPROVAL_SIGNAL)
    def approval_signal(self, raw: RawValue = approval.NO_INPUT) -> None:
        """The Temporal UI's "Send a Signal" lands here. Whatever changes nothing (a job that is
        not waiting, input that is not a decision) is recorded in `ignored_signals`."""
        s = self._state
        decision = approval.read_signal(raw)
        if isinstance(decision, str):
            ignored = IgnoredSignal(at=workflow.now(), why=decision, raw=approval.raw_text(raw))
            approval.ignore(s, ignored)
            return
        refusal = approval.refusal(s, decision)
        if refusal is not None:
            ignored = IgnoredSignal(**decision.model_dump(), at=workflow.now(), why=refusal)
            approval.ignore(s, ignored)
            return
        s.pending = Ticket(decision)

    @workflow.update(name=names.DECIDE_UPDATE)
    async def decide_approval(self, decision: ApprovalDecision) -> str:
        """`spillway approve|reject`: answers once the decision was used (or could not be: the
        budget, headroom that came back), so "approved" means the job goes to the cloud."""
        ticket = Ticket(decision)
        self._state.pending = ticket
        await workflow.wait_condition(lambda: ticket.settled)
        if ticket.refusal is not None:
            raise ApplicationError(ticket.refusal, type="ApprovalNotUsed", non_retryable=True)
        return ticket.answer or ""

    @workflow.update(name=names.PRIORITY_UPDATE)
    async def set_priority(self, change: PriorityChange) -> QueueSpot | None:
        """`spillway priority`: answers with the job's new place in the line once the pool has
        it (None: the change gave it a free place at once)."""
        s = self._state
        record = PriorityRecord(**change.model_dump(), at=workflow.now(), was=s.job.priority)
        s.plan.priority_changes = [*s.plan.priority_changes, record][-MAX_PRIORITY_CHANGES:]
        s.job = s.job.model_copy(update={"priority": change.priority})
        s.reprioritized = True
        # Also done when a place came first (it no longer waits: nothing to move).
        await workflow.wait_condition(
            lambda: not s.reprioritized or s.place is None or s.place.host is not None
        )
        s.publish()
        return s.plan.queue

    @set_priority.validator
    def _validate_priority(self, change: PriorityChange) -> None:
        s = self._state
        waiting = s.place is not None and s.place.host is None and not s.reprioritized
        if s.plan.state not in ("queued", "awaiting_approval") or not waiting:
            raise ValueError(
                f"job {s.job.job_id} is {s.plan.state}: only a job waiting in the GPU line "
                "(queued, or awaiting_approval) changes its priority"
            )

    @decide_approval.validator
    def _validate_approval(self, decision: ApprovalDecision) -> None:
        refusal = approval.refusal(self._state, decision)
        if refusal is not None:
            raise ValueError(refusal)
