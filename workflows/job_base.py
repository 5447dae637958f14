"""What every part of VideoJobWorkflow shares: the job, its plan, and how the plan is published
(memo for `spillway status`, search attributes for lists, current details for the UI), failed,
and counted. The workflow is split by concern (deciding in video_job.py, waiting for a person in
waiting.py, measuring the GPU hosts in measure.py, a person's decision in approvals.py, the
routes in local_route.py and cloud_route.py); all of it is workflow code."""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from temporalio import workflow
from temporalio.common import Priority, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout

from workflows import calls
from workflows.patches import PATCH_FLOOR, UNDER_FLOOR

with workflow.unsafe.imports_passed_through():
    from spillway import activity_names as names
    from spillway import search_attributes as sa
    from spillway.cloud_models import SpendRequest
    from spillway.host_models import HostRef
    from spillway.models import PLAN_MEMO, PRIORITY_MEMO, JobState, Plan, VideoJob
    from spillway.spend_models import SpendEntry, SpendSettle
    from workflows import texts

if TYPE_CHECKING:
    from workflows.approvals import RouteChoice, Ticket

SettleState = Literal["charged", "maybe_charged", "released"]
CREATES = (names.MINIMAX_CREATE, names.KLING_CREATE)
FAILED = "JobFailed"  # the type of the failure a failed job ends with
DISARMED = "fallback_disarmed"  # the reason a job waits when armed spending is refused now


class JobBase:
    _job: VideoJob
    _plan: Plan
    _pending: Ticket | None
    _deadline: datetime  # of the current approval window (datetime.max outside one)
    _published: str
    _create_started: datetime
    _unused_reservation: bool  # reserved, and no create started for it yet
    _heartbeat: timedelta
    _hosts: list[HostRef]  # empty: a job from before GPU hosts (its own task queue)
    _next_host: str | None  # where the latest measurement would run it locally
    _floor: bool | None  # PATCH_FLOOR: None until the run's first patch reads it

    def _patched(self, patch_id: str) -> bool:
        """`workflow.patched`, one marker for every patch under the floor (workflows/patches.py):
        the first patch a run meets reads the floor; a run that has it needs no other marker."""
        if patch_id in UNDER_FLOOR:
            if self._floor is None:
                self._floor = workflow.patched(PATCH_FLOOR)
            if self._floor:
                return True
        return workflow.patched(patch_id)

    def _count(self, choice: RouteChoice) -> None:
        workflow.metric_meter().create_counter(
            "spillway_jobs_routed", "jobs by the route they took and who allowed the cloud"
        ).add(
            1,
            {
                "route": choice.route,
                "authorised": choice.metric_label,
                "host": self._plan.host or "-",
                "provider": self._plan.cloud.provider if self._plan.cloud else "-",
            },
        )

    @property
    def _priority(self) -> Priority:
        """The job's activities queue by the job's priority (1 first), whichever client
        started it and whether or not it set the workflow's own."""
        return Priority(priority_key=self._job.priority)

    def _set_state(self, state: JobState) -> None:
        self._plan.state = state
        self._publish()

    def _published_at_start(self) -> str:
        """The plan's snapshot when the job's start already carries what its first publication
        would upsert (spillway's own clients start jobs so: see `spillway.jobs.submit`), so that
        the first workflow task upserts nothing: each upsert is two history events and two
        visibility writes. "" otherwise (another client, an older job: it publishes as before)."""
        try:
            plan = workflow.memo_value(PLAN_MEMO, None, type_hint=Plan)
            priority = workflow.memo_value(PRIORITY_MEMO, None)
        except Exception:  # a raw client's memo may hold anything
            return ""
        started = workflow.info().typed_search_attributes
        if (
            plan != self._plan
            or priority != self._job.priority
            or started.get(sa.STATE) != self._plan.state
            or any(started.get(key) is not None for key in sa.ALL if key is not sa.STATE)
        ):
            return ""
        workflow.set_current_details(texts.current_details(self._plan))
        return self._plan.model_dump_json()

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
        if plan.host is not None:
            updates.append(sa.HOST.value_set(plan.host))
        workflow.upsert_search_attributes(updates)
        # `priority` too: `list` reads it there (Temporal's list does not return a priority),
        # also for jobs whose client set no memo of its own.
        workflow.upsert_memo({PLAN_MEMO: plan, PRIORITY_MEMO: self._job.priority})
        workflow.set_current_details(texts.current_details(plan))

    def _fail(self, message: str) -> NoReturn:
        self._plan.error = message
        self._set_state("failed")
        raise ApplicationError(message, type=FAILED, non_retryable=True)

    def _failure_message(self, err: ActivityError) -> str:
        cause = err.cause
        if err.activity_type in CREATES and isinstance(cause, ActivityTimeout):
            return texts.ambiguous_create(self._plan, self._create_started)
        if isinstance(cause, ApplicationError | ActivityTimeout):
            return cause.message
        return str(cause or err)

    # --- the spend ledger, from the workflow's side ----------------------------------------------

    async def _settle(
        self, state: SettleState, task_id: str | None, cost_usd: float | None = None
    ) -> SpendEntry | None:
        settle = SpendSettle(
            job_id=self._job.job_id, state=state, task_id=task_id, cost_usd=cost_usd
        )
        return await calls.spend_settle(settle)

    def _spend_request(self, choice: RouteChoice, provider: str) -> SpendRequest:
        request = self._job.cloud
        assert request is not None
        return SpendRequest(
            job_id=self._job.job_id,
            provider=provider,
            resolution=request.resolution,
            duration=request.duration,
            request=request,
            authorised_by=choice.by or "armed",
            authorisation=choice.authorisation or "armed",
        )
