"""AWAIT, the part of VideoJobWorkflow that waits for a person: the approval is asked for (with
the budget read and the owner notified), then the job waits for a decision, the approval window's
end or the GPU's headroom, re-probing every recheck interval, and continues as new when its
history grows long. Workflow code."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import NoReturn

from temporalio import workflow

from workflows.approvals import LOCAL, Approvals, RouteChoice
from workflows.cloud_route import CloudRoute
from workflows.measure import Measure
from workflows.patches import PATCH_RECORDED_BEFORE_ASKING

with workflow.unsafe.imports_passed_through():
    from spillway.host_models import Policy
    from spillway.models import AwaitCarry
    from workflows import texts


class Waiting(Approvals, CloudRoute, Measure):
    _notify_task: asyncio.Task[None] | None  # the approval notice, sent in the background

    async def _await_person(self, policy: Policy, because: str | None) -> RouteChoice:
        recorded = await self._recorded_create()
        if recorded is not None:
            return recorded
        now = workflow.now()
        if because is not None:
            self._plan.reasons = [*self._plan.reasons, because]
        self._plan.state = "awaiting_approval"
        if self._patched(PATCH_RECORDED_BEFORE_ASKING):
            self._publish()  # the memo says so too while the budget is read (a worker may stop)
        deadline = now + timedelta(seconds=policy.approval_timeout_s)
        self._deadline = deadline  # decisions arriving from now on are judged against it
        await self._read_budget()
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
            load = await self._measure(policy)
            if load.reachable and not load.overloaded:
                self._plan.reasons = [*self._plan.reasons, "headroom_returned"]
                self._plan.overflow.last_signal = load
                if self._pending is not None:  # arrived while the probe ran: local wins
                    self._unused(self._pending, texts.headroom_won())
                    self._pending = None
                return LOCAL
            self._note_load(load)

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
