"""The CLOUD route of VideoJobWorkflow: providers in the order of CLOUD_PROVIDERS (those with keys
on the worker), each create reserved in the spend ledger first and never sent twice; a provider
that provably made nothing (no balance, quota, pack used up) hands the job to the next one when
the budget covers the next estimate (docs/design.md, "The decision" and "Money invariants").
It asks each provider's shape (activities/cloud/provider.py) and names none. The ledger seen
from the workflow's side lives here too: what a person is shown of the budget, and the create a
reset job finds already recorded. Workflow code.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace
from datetime import datetime

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.exceptions import TimeoutError as ActivityTimeout

from workflows import activity_calls as calls
from workflows.job_state import ARMED, RouteChoice, VideoJobState, failure_message

with workflow.unsafe.imports_passed_through():
    from activities.cloud.models import CloudCreate, CloudDownload, CloudPoll, LostCreate
    from activities.cloud.provider import CloudProvider
    from activities.cloud.registry import PROVIDERS
    from activities.spend.activities import SpendRequest
    from activities.spend.guard import NOT_ARMED, WRONG_WORLD
    from spillway.core.decision import BUDGET_EXHAUSTED, Line, Seen, Verdict, is_armed, route
    from spillway.core.ledger import (
        BudgetShortfall,
        Reservation,
        SettleState,
        SpendEntry,
        SpendSettle,
    )
    from spillway.core.models import CloudAttempt, CloudInfo, CloudQuote, Quote
    from spillway.core.spend_book import REFUSED
    from workflows import texts

DISARMED = "fallback_disarmed"  # the reason a job waits when armed spending is refused now


# A create whose worker was lost before the ledger's `begin` (a starved or dead worker: the
# server started the activity and heard nothing more) is sent anew up to this many times.
NOT_BEGUN_TRIES = 3


class Refused(Exception):
    """A provider's provable "no" to a create (its ledger entry is released)."""


class NotBegun(Exception):
    """The create's worker was lost before the create began: nothing was sent (the ledger
    released the reservation)."""


async def run(s: VideoJobState, choice: RouteChoice) -> str | None:
    """Reserves (unless the approval did), creates once, polls, downloads. Returns why the job
    must wait for a person instead (the budget, a disarmed fallback), else None."""
    request = s.job.cloud
    if request is None:  # decide() and the approval checks make this unreachable
        s.fail(f"job {s.job.job_id} has no cloud prompt: it can only run locally")
    reservation = choice.reservation
    attempts: list[CloudAttempt] = []
    if reservation is not None and reservation.existing is not None:
        await _follow_recorded(s, choice, reservation, reservation.existing)
        return None
    providers, lost = list(s.policy.providers), 0
    while providers:
        name = providers[0]
        if reservation is None:
            reservation = await calls.spend_reserve(spend_request(s, choice, name))
            if reservation.shortfall is not None:
                s.plan.budget = texts.exhausted_view(s.plan.budget, reservation.shortfall)
                requote(s, choice, shortfall=reservation.shortfall)
                return BUDGET_EXHAUSTED
            if reservation.refused is not None:  # no longer armed on this worker
                requote(s, choice, disarmed=True)
                return reservation.refused_code or DISARMED
            if reservation.existing is not None:
                await _follow_recorded(s, choice, reservation, reservation.existing)
                return None
        _start(s, choice, name, reservation, attempts)
        provider = PROVIDERS[name]
        create = CloudCreate(
            job_id=s.job.job_id,
            request=request,
            authorisation=choice.authorisation or "armed",
            simulated=s.policy.simulated,
            first_frame=s.job.inputs[0] if s.job.inputs else None,
        )
        try:
            task_id = await _create(s, provider, create)
        except Refused as refused:
            attempts.append(CloudAttempt(provider=name, outcome="refused", why=str(refused)))
            reservation = None
            providers.pop(0)
            continue
        except NotBegun:
            # The ledger proves nothing was sent (its reservation is released), so the same
            # provider is asked anew, under a new reservation, a few times at most.
            lost += 1
            s.reason(f"create_lost_before_it_began={lost}")
            if lost >= NOT_BEGUN_TRIES:
                s.fail(texts.create_never_began(s.plan, lost))
            reservation = None
            continue
        if task_id == DISARMED:
            requote(s, choice, disarmed=True)
            return DISARMED
        await _render(s, choice, provider, task_id)
        return None
    s.fail(texts.every_provider_refused(attempts))


async def _follow_recorded(
    s: VideoJobState, choice: RouteChoice, reservation: Reservation, entry: SpendEntry
) -> None:
    """A job whose create another run already sent follows that create's task."""
    _start(s, choice, entry.provider, reservation, [])
    provider, task_id = _follow(s, entry)
    await _render(s, choice, provider, task_id)


def spend_request(s: VideoJobState, choice: RouteChoice, provider: str) -> SpendRequest:
    request = s.job.cloud
    assert request is not None
    return SpendRequest(
        job_id=s.job.job_id,
        provider=provider,
        request=request,
        authorised_by=choice.by or "armed",
        authorisation=choice.authorisation or "armed",
        team=s.plan.team,
    )


def _first_provider(s: VideoJobState) -> str:
    """The provider a job would be reserved for first ("" when the worker has no keys)."""
    return s.policy.providers[0] if s.policy.providers else ""


async def recorded_create(s: VideoJobState) -> RouteChoice | None:
    """A job reset after its create (the old approval re-applied too early to count) finds its
    task on the ledger and follows it instead of waiting for a person."""
    if s.job.cloud is None:
        return None
    try:
        entry = await calls.spend_recorded(spend_request(s, ARMED, _first_provider(s)))
    except ActivityError as err:
        _unless_cancelled(err)
        workflow.logger.warning("spend ledger lookup failed: %s", err.cause or err)
        return None
    if entry is None:
        return None
    return RouteChoice(
        "cloud",
        authorisation=entry.authorisation,
        by=entry.authorised_by,
        reservation=Reservation(existing=entry),
    )


async def read_budget(s: VideoJobState) -> None:
    """The estimate and what the budgets have left, for the person who is asked."""
    if s.job.cloud is None:
        return
    known = s.plan.budget
    exhausted = (
        {"exhausted": known.exhausted, "exhausted_team": known.exhausted_team} if known else {}
    )
    try:
        view = await calls.spend_view(spend_request(s, ARMED, _first_provider(s)))
        s.plan.budget = view.model_copy(update=exhausted)
        if s.plan.quote is not None:
            s.plan.quote.cloud = cloud_quote(s)
    except ActivityError as err:  # shown to people only
        _unless_cancelled(err)
        workflow.logger.warning("budget view failed: %s", err.cause or err)


def cloud_quote(s: VideoJobState) -> CloudQuote | None:
    """A quote's cloud part: the first provider, with the figures of the budget view the job
    read (none before it read one)."""
    if s.job.cloud is None or not s.policy.providers:
        return None
    return CloudQuote.of(s.policy.providers[0], s.plan.budget)


def quote_of(s: VideoJobState, verdict: Verdict) -> Quote:
    """The job's quote: the decision's route and why, as `spillway quote` gives them."""
    return Quote(local=verdict.local, cloud=cloud_quote(s), route=verdict.quote, why=verdict.why)


def requote(
    s: VideoJobState,
    choice: RouteChoice,
    shortfall: BudgetShortfall | None = None,
    disarmed: bool = False,
) -> None:
    """The ledger refused the job's reservation (its budget cannot cover the estimate, or armed
    spending is off now): its quote says so, by the rules it decided with, instead of the
    "armed" it decided on. A job that decided before it showed quotes keeps none."""
    if s.plan.quote is None:
        return
    seen = s.seen or _seen_again(s)
    if seen is None:
        return
    if shortfall is not None:
        seen = seen.refused(shortfall)
    sent = choice.authorisation or "armed"
    if disarmed:  # what it was sent as armed for no longer holds: a person decides
        seen = replace(seen, armed=False)
    seen = replace(seen, approval=None if disarmed and sent == "armed" else sent)
    s.plan.quote = quote_of(s, route(seen))


def _seen_again(s: VideoJobState) -> Seen | None:
    """A run continued as new keeps no measurement but its plan's: the reading that made it
    wait and where it stood in the line."""
    load = s.plan.overflow.last_signal
    if load is None or s.plan.quote is None:
        return None
    local = s.plan.quote.local
    return Seen(
        load=load,
        armed=is_armed(s.policy.fallback_enabled, s.policy.key_present, s.job.cloud is not None),
        has_cloud=s.job.cloud is not None,
        hosts=tuple(h.name for h in s.policy.hosts),
        unfit=tuple(s.unfit or ()),
        line=Line(position=local.position, eta_s=local.eta_s) if local.position else None,
    )


async def release_unused(s: VideoJobState) -> None:
    """A job cancelled between its reservation and its create gives the money back."""
    if s.unused_reservation:
        s.unused_reservation = False
        await _settle(s, "released", None)


def _unless_cancelled(err: ActivityError) -> None:
    """A read that fails leaves the question to the person, but one cancelled because the job
    was cancelled must end the job: the cancel reaches a workflow only once."""
    if is_cancelled_exception(err):
        raise err


def _start(
    s: VideoJobState,
    choice: RouteChoice,
    provider: str,
    reservation: Reservation,
    attempts: list[CloudAttempt],
) -> None:
    held = reservation.granted or reservation.existing
    s.plan.route = "cloud"
    s.plan.cloud = CloudInfo(
        provider=provider,
        authorised_by=choice.by or "armed",
        authorisation=choice.authorisation or "armed",
        estimated_cost_usd=held.cost_usd if held else None,
        attempts=list(attempts),
    )
    s.set_state("running_cloud")
    s.unused_reservation = reservation.granted is not None


async def _render(
    s: VideoJobState, choice: RouteChoice, provider: CloudProvider, task_id: str
) -> None:
    cloud = s.plan.cloud
    assert cloud is not None
    cloud.provider, cloud.task_id = provider.name, task_id
    s.count(choice)
    s.publish()
    poll = CloudPoll(job_id=s.job.job_id, task_id=task_id)
    done = await calls.cloud_poll(provider, poll, s.heartbeat, s.priority)
    cloud.units = done.units
    # How long the video took from its create, for the cloud's ETA: only by a run that sent it.
    sent = s.create_started if s.create_started != datetime.min else None
    took = (workflow.now() - sent).total_seconds() if sent and s.policy.cloud_eta else None
    if done.cost_usd is not None or took is not None:
        if done.cost_usd is not None:  # the provider's own figure replaces the estimate
            cloud.cost_usd = done.cost_usd
        await _settle(s, "charged", task_id, done.cost_usd, done_s=took)
    download = CloudDownload(
        job_id=s.job.job_id,
        task_id=task_id,
        file_id=done.file_id,
        video_url=done.video_url,
    )
    s.plan.outputs = (
        await calls.cloud_download(provider, download, s.heartbeat, s.priority)
    ).outputs


async def _create(s: VideoJobState, provider: CloudProvider, req: CloudCreate) -> str:
    """The task id, or DISARMED when the fallback was disarmed before anything was sent; raises
    Refused when the provider provably made nothing, NotBegun when the create never began."""
    s.create_started = workflow.now()
    handle = calls.cloud_create(provider, req, s.heartbeat, s.priority)
    s.unused_reservation = False  # the create's own guard settles it from here
    try:
        created = await asyncio.shield(handle)
    except asyncio.CancelledError:
        # A create once scheduled is never abandoned: the job ends cancelled, but only after
        # recording what it ordered (a task that will be charged).
        try:
            ordered = await handle
        except ActivityError as err:
            s.plan.error = _create_failure(s, err)
            raise asyncio.CancelledError() from None
        assert s.plan.cloud is not None
        s.plan.cloud.task_id = ordered.task_id
        s.reason(f"cancelled_after_create={ordered.task_id}")
        s.plan.error = texts.cancelled_after_create(provider.name, ordered.task_id)
        if not ordered.settled:
            await _settle(s, "charged", ordered.task_id)
        raise
    except ActivityError as err:
        return await _create_failed(s, provider, req, err)
    if not created.settled:
        await _settle(s, "charged", created.task_id)
    return created.task_id


async def _create_failed(
    s: VideoJobState, provider: CloudProvider, req: CloudCreate, err: ActivityError
) -> str:
    cause = err.cause
    kind = cause.type if isinstance(cause, ApplicationError) else None
    if kind in provider.refused and isinstance(cause, ApplicationError):
        details = cause.details[0] if cause.details else {}
        if isinstance(details, dict) and details.get("settled") is False:
            # The create's own settle did not reach the ledger: until this one does, the entry
            # blocks the next provider's reservation and counts against the budget. Only the
            # attempt's nonce frees it; the attempt gave it up with its refusal.
            await _settle(s, "refused", None, nonce=str(details.get("release") or ""))
        raise Refused(cause.message)
    if kind in (NOT_ARMED, WRONG_WORLD, provider.no_key):
        await _settle(s, "released", None)  # nothing was sent
        if kind == NOT_ARMED:
            return DISARMED
        s.fail(_create_failure(s, err))
    if kind == REFUSED and isinstance(cause, ApplicationError):
        details = cause.details[0] if cause.details else {}
        entry = details.get("entry") if isinstance(details, dict) else None
        if entry:
            return _follow(s, SpendEntry.model_validate(entry))[1]
        s.fail(cause.message)
    if isinstance(cause, ActivityTimeout):
        # The worker was lost during the create: did it begin? The ledger knows.
        found = await _settle(s, "maybe_charged", None)
        if found is not None and found.state == "released":
            raise NotBegun()
        if found is not None and found.state == "refused":
            # The attempt recorded the provider's provable "no" before its worker was lost.
            raise Refused(found.note or "refused before making anything")
        # The create had recorded its task before the worker was lost: follow that task.
        if found is not None and found.state == "charged" and found.task_id:
            return _follow(s, found)[1]
        if found is not None and found.state == "maybe_charged" and provider.reconciles:
            return await _reconcile_lost(s, provider, req, found, err)
    s.fail(_create_failure(s, err))


async def _reconcile_lost(
    s: VideoJobState,
    provider: CloudProvider,
    req: CloudCreate,
    entry: SpendEntry,
    err: ActivityError,
) -> str:
    """A provider that reconciles can say, by the id the create of the run that sent it
    carried, whether a create whose worker was lost made a task: the job follows that task and
    never creates again. Without an answer, or without a task, it fails saying a charge may
    exist, as it does for a provider that cannot be asked."""
    lost = LostCreate(
        job_id=s.job.job_id,
        request=req.request,
        first_frame=req.first_frame is not None,
        run_id=entry.run_id,
        sent_at=entry.sent_at or s.create_started,
    )
    ambiguous = _create_failure(s, err)
    try:
        found = await calls.cloud_reconcile(provider, lost, s.heartbeat, s.priority)
    except ActivityError as failed:
        if is_cancelled_exception(failed):
            s.plan.error = ambiguous
            raise
        s.fail(texts.lost_create_unanswered(provider.name, ambiguous, failed.cause))
    if found.task_id is None:
        s.fail(texts.lost_create_made_nothing(provider.name, ambiguous, found))
    s.reason(f"reconciled_lost_create={found.task_id}")
    await _settle(s, "charged", found.task_id)
    return found.task_id


def _create_failure(s: VideoJobState, err: ActivityError) -> str:
    """A create whose worker was lost mid-call is ambiguous: a charge may exist."""
    if isinstance(err.cause, ActivityTimeout):
        return texts.ambiguous_create(s.plan, s.create_started)
    return failure_message(err)


def _follow(s: VideoJobState, entry: SpendEntry) -> tuple[CloudProvider, str]:
    """A run that finds its job already charged follows the recorded task, never creates."""
    provider = PROVIDERS.get(entry.provider)
    if entry.state != "charged" or not entry.task_id or provider is None:
        s.fail(texts.create_exists(s.plan, entry))
    s.reason(f"followed_recorded_task={entry.task_id}")
    return provider, entry.task_id


async def _settle(
    s: VideoJobState,
    state: SettleState,
    task_id: str | None,
    cost_usd: float | None = None,
    nonce: str = "",
    done_s: float | None = None,
) -> SpendEntry | None:
    settle = SpendSettle(
        job_id=s.job.job_id,
        state=state,
        task_id=task_id,
        cost_usd=cost_usd,
        nonce=nonce,
        done_s=done_s,
    )
    return await calls.spend_settle(settle)
