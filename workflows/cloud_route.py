"""The CLOUD route of VideoJobWorkflow: providers in the order of CLOUD_PROVIDERS (those with keys
on the worker), each create reserved in the spend ledger first and never sent twice; a provider
that provably made nothing (no balance, quota, pack used up) hands the job to the next one when
the budget covers the next estimate (docs/design.md, "The decision" and "Money invariants")."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from types import MappingProxyType

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.exceptions import TimeoutError as ActivityTimeout

from workflows import calls
from workflows.approvals import ARMED, RouteChoice
from workflows.job_base import DISARMED, JobBase
from workflows.patches import (
    PATCH_BUDGET_VIEW,
    PATCH_CANCEL_THROUGH_READS,
    PATCH_FOLLOW_LOST_CREATE,
    PATCH_LEDGER,
    PATCH_RECONCILE_LOST_CREATE,
    PATCH_RECORDED_BEFORE_ASKING,
)

with workflow.unsafe.imports_passed_through():
    from activities import kling as kling_errors
    from activities import minimax as minimax_errors
    from activities.spend import NOT_ARMED, WRONG_WORLD
    from spillway.cloud_models import CloudCreate, CloudDownload, CloudPoll, LostCreate, Provider
    from spillway.host_models import Policy
    from spillway.kling_requests import kind_of
    from spillway.models import CloudAttempt, CloudInfo
    from spillway.spend_models import Reservation, SpendEntry
    from workflows import texts
    from workflows.spend_ledger import REFUSED

# The provider said no and made nothing: the next provider may take the job.
PROVIDER_REFUSED = frozenset(
    {
        minimax_errors.PERMANENT,
        minimax_errors.CREATE_GAVE_UP,
        kling_errors.REFUSED,
        kling_errors.CREATE_GAVE_UP,
    }
)


KNOWN_PROVIDERS: Mapping[str, Provider] = MappingProxyType({"minimax": "minimax", "kling": "kling"})


class Refused(Exception):
    """A provider's provable "no" to a create (its ledger entry is released)."""


class CloudRoute(JobBase):
    _providers: list[Provider]  # in order; a job from before Kling knows only MiniMax
    _choice: RouteChoice  # who allowed the cloud, for the metric once a task exists

    async def _run_cloud(self, policy: Policy, choice: RouteChoice) -> str | None:
        """Reserves (unless the approval did), creates once, polls, downloads. Returns why the
        job must wait for a person instead (the budget, a disarmed fallback), else None."""
        request = self._job.cloud
        if request is None:  # decide() and the approval checks make this unreachable
            self._fail(f"job {self._job.job_id} has no cloud prompt: it can only run locally")
        reservation = choice.reservation
        attempts: list[CloudAttempt] = []
        for provider in self._providers:
            if reservation is None and self._patched(PATCH_LEDGER):
                reservation = await calls.spend_reserve(self._spend_request(choice, provider))
                if reservation.shortfall is not None:
                    self._plan.budget = texts.exhausted_view(
                        self._plan.budget, reservation.shortfall
                    )
                    return "budget_exhausted"
                if reservation.refused is not None:
                    return reservation.refused_code or DISARMED
            self._start_cloud(policy, choice, provider, reservation, attempts)
            existing = reservation.existing if reservation else None
            if existing is not None:
                provider, task_id = self._follow(existing)
            else:
                create = CloudCreate(
                    job_id=self._job.job_id,
                    request=request,
                    authorisation=choice.authorisation or "armed",
                    simulated=policy.simulated,
                    provider=provider,
                    first_frame=self._job.inputs[0] if self._job.inputs else None,
                )
                try:
                    task_id = await self._create(create)
                except Refused as refused:
                    why = str(refused)
                    attempts.append(CloudAttempt(provider=provider, outcome="refused", why=why))
                    reservation = None
                    continue
                if task_id == DISARMED:
                    return DISARMED
            await self._render_in_the_cloud(provider, task_id)
            return None
        self._fail(texts.every_provider_refused(attempts))

    async def _recorded_create(self) -> RouteChoice | None:
        """A job reset after its create (the old approval re-applied too early to count) finds
        its task on the ledger and follows it instead of waiting for a person."""
        if self._job.cloud is None or not self._patched(PATCH_RECORDED_BEFORE_ASKING):
            return None
        try:
            entry = await calls.spend_recorded(self._spend_request(ARMED, self._providers[0]))
        except ActivityError as err:
            self._unless_cancelled(err)
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

    async def _read_budget(self) -> None:
        """The estimate and what the budgets have left, for the person who is asked."""
        if self._job.cloud is None or not self._patched(PATCH_BUDGET_VIEW):
            return
        exhausted = self._plan.budget.exhausted if self._plan.budget else None
        try:
            view = await calls.spend_view(self._spend_request(ARMED, self._providers[0]))
            self._plan.budget = view.model_copy(update={"exhausted": exhausted})
        except ActivityError as err:  # shown to people only
            self._unless_cancelled(err)
            workflow.logger.warning("budget view failed: %s", err.cause or err)

    def _unless_cancelled(self, err: ActivityError) -> None:
        """A read that fails leaves the question to the person, but one cancelled because the
        job was cancelled must end the job: the cancel reaches a workflow only once."""
        if is_cancelled_exception(err) and self._patched(PATCH_CANCEL_THROUGH_READS):
            raise err

    def _start_cloud(
        self,
        policy: Policy,
        choice: RouteChoice,
        provider: Provider,
        reservation: Reservation | None,
        attempts: list[CloudAttempt],
    ) -> None:
        request = self._job.cloud
        assert request is not None
        cost = policy.estimated_costs_usd.get(f"{request.resolution}/{request.duration}s")
        if reservation is not None and reservation.granted is not None:
            cost = reservation.granted.cost_usd
        self._plan.route = "cloud"
        self._plan.cloud = CloudInfo(
            provider=provider,
            authorised_by=choice.by or "armed",
            authorisation=choice.authorisation,
            estimated_cost_usd=cost,
            attempts=list(attempts),
        )
        self._choice = choice
        self._set_state("running_cloud")
        self._unused_reservation = reservation is not None and reservation.granted is not None

    async def _render_in_the_cloud(self, provider: Provider, task_id: str) -> None:
        assert self._plan.cloud is not None
        self._plan.cloud.provider, self._plan.cloud.task_id = provider, task_id
        self._count(self._choice)
        self._publish()
        poll = CloudPoll(job_id=self._job.job_id, task_id=task_id, provider=provider)
        done = await calls.cloud_poll(poll, self._heartbeat, self._priority)
        self._plan.cloud.units = done.units
        if done.cost_usd is not None:  # the provider's own figure replaces the estimate
            self._plan.cloud.cost_usd = done.cost_usd
            await self._settle("charged", task_id, done.cost_usd)
        download = CloudDownload(
            job_id=self._job.job_id,
            task_id=task_id,
            file_id=done.file_id,
            video_url=done.video_url,
            provider=provider,
        )
        self._plan.outputs = (
            await calls.cloud_download(download, self._heartbeat, self._priority)
        ).outputs

    async def _create(self, req: CloudCreate) -> str:
        """The task id, or DISARMED when the fallback was disarmed before anything was sent;
        raises Refused when the provider provably made nothing."""
        self._create_started = workflow.now()
        handle = calls.cloud_create(req, self._heartbeat, self._priority)
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
            self._plan.error = texts.cancelled_after_create(req.provider, ordered.task_id)
            if not ordered.settled:
                await self._settle("charged", ordered.task_id)
            raise
        except ActivityError as err:
            return await self._create_failed(req, err)
        if not created.settled:
            await self._settle("charged", created.task_id)
        return created.task_id

    async def _create_failed(self, req: CloudCreate, err: ActivityError) -> str:
        cause = err.cause
        kind = cause.type if isinstance(cause, ApplicationError) else None
        if kind in PROVIDER_REFUSED and isinstance(cause, ApplicationError):
            raise Refused(cause.message)
        if kind in (NOT_ARMED, WRONG_WORLD, minimax_errors.NO_KEY, kling_errors.NO_KEY):
            await self._settle("released", None)  # nothing was sent
            if kind == NOT_ARMED:
                return DISARMED
            self._fail(self._failure_message(err))
        if kind == REFUSED and isinstance(cause, ApplicationError):
            details = cause.details[0] if cause.details else {}
            entry = details.get("entry") if isinstance(details, dict) else None
            if entry:
                return self._follow(SpendEntry.model_validate(entry))[1]
            self._fail(cause.message)
        if isinstance(cause, ActivityTimeout):
            # The worker was lost during the create: did it begin? The ledger knows.
            entry = await self._settle("maybe_charged", None)
            if entry is not None and entry.state == "released":
                self._fail(texts.create_never_began(self._plan))
            # The create had recorded its task before the worker was lost: follow that task.
            charged = entry is not None and entry.state == "charged" and entry.task_id
            if charged and entry and self._patched(PATCH_FOLLOW_LOST_CREATE):
                return self._follow(entry)[1]
            if (
                req.provider == "kling"
                and entry is not None
                and entry.state == "maybe_charged"
                and self._patched(PATCH_RECONCILE_LOST_CREATE)
            ):
                return await self._reconcile_lost(req, entry, err)
        self._fail(self._failure_message(err))

    async def _reconcile_lost(self, req: CloudCreate, entry: SpendEntry, err: ActivityError) -> str:
        """Kling can say, by the external_task_id of the run that sent it, whether a create
        whose worker was lost made a task: the job follows that task and never creates again.
        Without an answer, or without a task, it fails saying a charge may exist, as a MiniMax
        job does."""
        lost = LostCreate(
            job_id=self._job.job_id,
            kind=kind_of(req.request, req.first_frame is not None),
            run_id=entry.run_id,
            sent_at=entry.sent_at or self._create_started,
        )
        try:
            found = await calls.kling_reconcile(lost, self._heartbeat, self._priority)
        except ActivityError as failed:
            if is_cancelled_exception(failed):
                self._plan.error = self._failure_message(err)
                raise
            self._fail(texts.lost_create_unanswered(self._failure_message(err), failed.cause))
        if found.task_id is None:
            self._fail(texts.lost_create_made_nothing(self._failure_message(err), found))
        self._plan.reasons = [*self._plan.reasons, f"reconciled_lost_create={found.task_id}"]
        await self._settle("charged", found.task_id)
        return found.task_id

    async def _release_unused_reservation(self) -> None:
        """A job cancelled between its reservation and its create gives the money back."""
        if self._unused_reservation:
            self._unused_reservation = False
            await self._settle("released", None)

    def _follow(self, entry: SpendEntry) -> tuple[Provider, str]:
        """A run that finds its job already charged follows the recorded task, never creates."""
        provider = KNOWN_PROVIDERS.get(entry.provider)
        if entry.state != "charged" or not entry.task_id or provider is None:
            self._fail(texts.create_exists(self._plan, entry))
        self._plan.reasons = [*self._plan.reasons, f"followed_recorded_task={entry.task_id}"]
        return provider, entry.task_id
