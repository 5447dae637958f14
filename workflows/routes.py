"""The two routes of a job once it is decided: LOCAL (ComfyUI: submit, wait, download, and take
the prompt back out when the job is cancelled) and CLOUD (reserve in the spend ledger unless the
approval did, create once, poll, download; docs/design.md, "Money invariants")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout

from workflows import calls
from workflows.approvals import LOCAL, PATCH_LEDGER, PATCH_PROMPT_PER_RUN, RouteChoice
from workflows.job_base import JobBase

with workflow.unsafe.imports_passed_through():
    from activities import minimax as minimax_errors
    from activities.spend import NOT_ARMED, WRONG_WORLD
    from spillway.comfyui_models import (
        ComfyUICancel,
        ComfyUIDownload,
        ComfyUISubmit,
        ComfyUIWait,
        client_id_for,
        prompt_id_for,
    )
    from spillway.minimax_models import MiniMaxCreate, MiniMaxDownload, MiniMaxPoll
    from spillway.models import CloudInfo, HostRef, Policy
    from spillway.spend_models import SpendEntry
    from workflows import texts
    from workflows.spend_ledger import REFUSED

DISARMED = "fallback_disarmed"  # the reason a job waits when armed spending is refused now
_T = TypeVar("_T")


async def to_the_end(work: Awaitable[_T]) -> _T:
    """Awaits `work` even when the job is cancelled meanwhile, then lets the cancel through: what
    was sent (a prompt, a paid create) is known before the job cleans up after it."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(ActivityError):
            await task
        raise


class Routes(JobBase):
    # --- LOCAL ---------------------------------------------------------------------------------

    async def _run_local(self, policy: Policy) -> None:
        self._plan.route = "local"
        host = self._host_named(self._next_host)
        self._plan.host = host.name if host else None
        self._count(LOCAL)
        client_id = client_id_for(self._job.job_id)
        # A reset or re-run gets prompt ids of its own: a long-lived ComfyUI still holds the
        # earlier run's prompt (and its video) under the old one.
        run = workflow.info().run_id if workflow.patched(PATCH_PROMPT_PER_RUN) else None
        while self._plan.local_attempts < policy.comfyui_max_attempts:
            self._plan.local_attempts += 1
            prompt_id = prompt_id_for(self._job.job_id, self._plan.local_attempts, run)
            self._plan.prompt_id = prompt_id
            self._set_state("running_local")
            submit = ComfyUISubmit(
                job_id=self._job.job_id,
                prompt_id=prompt_id,
                client_id=client_id,
                graph=self._job.graph,
            )
            # Never abandoned: a job cancelled mid-submit waits for it, then takes it back out.
            await to_the_end(calls.comfyui_submit(submit, self._heartbeat, host))
            wait = ComfyUIWait(job_id=self._job.job_id, prompt_id=prompt_id, client_id=client_id)
            finished = await calls.comfyui_wait(wait, self._heartbeat, host)
            if finished.outcome == "lost":
                # ComfyUI restarted and forgot the prompt: resubmitting locally costs nothing.
                self._plan.reasons = [*self._plan.reasons, f"comfyui_lost_prompt={prompt_id}"]
                continue
            download = ComfyUIDownload(job_id=self._job.job_id, files=finished.files)
            downloaded = await calls.comfyui_download(download, self._heartbeat, host)
            self._plan.outputs = downloaded.outputs
            return
        self._fail(texts.lost_too_often(self._plan.local_attempts))

    def _host_named(self, name: str | None) -> HostRef | None:
        """The host to run on; None for a job from before hosts (its own task queue)."""
        if not self._hosts:
            return None
        return next((h for h in self._hosts if h.name == name), self._hosts[0])

    async def _cancel_local_prompt(self) -> None:
        if self._plan.route != "local" or self._plan.prompt_id is None:
            return
        # A job shows `cancelled` only once ComfyUI no longer holds its prompt.
        cancel = ComfyUICancel(prompt_id=self._plan.prompt_id)
        host = self._host_named(self._plan.host)
        cancelled = await calls.comfyui_cancel(cancel, self._heartbeat, host)
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
