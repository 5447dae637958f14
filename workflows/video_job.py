"""VideoJobWorkflow: measure, decide, maybe wait for a person, then render locally or in the cloud.

Deterministic: only models, the pure `decide` and activity calls by name. Every measurement is an
activity result, so the history shows why each job went where it went; the plan is published as
memo (readable without a worker), search attributes (for lists) and current details (for the UI).
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta
from typing import Any, Literal, NoReturn

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception
from temporalio.exceptions import TimeoutError as ActivityTimeout

with workflow.unsafe.imports_passed_through():
    from spillway import search_attributes as sa
    from spillway.comfyui_models import (
        ComfyUICancel,
        ComfyUICancelled,
        ComfyUIDownload,
        ComfyUIFinished,
        ComfyUISubmit,
        ComfyUISubmitted,
        ComfyUIWait,
        client_id_for,
        prompt_id_for,
    )
    from spillway.decision import decide
    from spillway.minimax_models import (
        MiniMaxCreate,
        MiniMaxCreated,
        MiniMaxDone,
        MiniMaxDownload,
        MiniMaxPoll,
    )
    from spillway.models import (
        ApprovalDecision,
        ApprovalNotice,
        ApprovalRecord,
        AwaitCarry,
        CloudInfo,
        Downloaded,
        IgnoredSignal,
        JobState,
        LoadProbeRequest,
        LoadStatus,
        Plan,
        Policy,
        PolicyRequest,
        VideoJob,
    )
    from workflows import texts

# Reads that cost nothing may retry for as long as it takes; a stuck one is visible in the UI.
FREE_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1), maximum_interval=timedelta(seconds=30)
)
# MiniMax has no idempotency key: Temporal must never run a create twice (money invariant 2).
NEVER_RETRY = RetryPolicy(maximum_attempts=1)
MAX_IGNORED_SIGNALS = 20

Route = Literal["local", "cloud"]


@workflow.defn(name="VideoJobWorkflow")
class VideoJobWorkflow:
    @workflow.init
    def __init__(self, job: VideoJob) -> None:
        self._job = job
        self._plan = job.carry.plan if job.carry else Plan(job_id=job.job_id)
        self._pending: ApprovalDecision | None = job.carry.pending_approval if job.carry else None
        self._notify_task: asyncio.Task[None] | None = None
        self._published = ""
        self._create_started = datetime.min
        self._heartbeat = timedelta(seconds=30)

    @workflow.run
    async def run(self, job: VideoJob) -> Plan:
        try:
            policy = job.carry.policy if job.carry else await self._read_policy()
            # A dead worker's long activity moves to another worker after this (at most 30 s).
            self._heartbeat = timedelta(seconds=policy.heartbeat_timeout_s)
            route, authorised_by = await self._route(job, policy)
            workflow.metric_meter().create_counter(
                "spillway_jobs_routed", "jobs by the route they took and who allowed the cloud"
            ).add(1, {"route": route, "authorised": _authorisation(route, authorised_by)})
            if route == "local":
                await self._run_local(policy)
            else:
                await self._run_cloud(policy, authorised_by)
        except (asyncio.CancelledError, ActivityError) as err:
            if isinstance(err, ActivityError) and not is_cancelled_exception(err):
                self._fail(self._failure_message(err))
            await self._cancel_local_prompt()
            self._set_state("cancelled")
            raise
        self._plan.progress = None
        self._set_state("completed")
        return self._plan

    # --- queries, signals, updates -----------------------------------------------------------

    @workflow.query(name="plan")
    def plan(self) -> Plan:
        return self._plan

    @workflow.signal(name="approval")
    def approval(self, decision: ApprovalDecision) -> None:
        """The Temporal UI's "Send a Signal" lands here; a signal for a job that is not waiting
        changes nothing and is recorded."""
        refusal = self._refusal(decision)
        if refusal is None:
            self._pending = decision
            return
        ignored = IgnoredSignal(**decision.model_dump(), at=workflow.now(), why=refusal)
        self._plan.ignored_signals = [*self._plan.ignored_signals, ignored][-MAX_IGNORED_SIGNALS:]
        workflow.logger.info("approval signal ignored: %s", refusal)
        self._publish()

    @workflow.update(name="decide_approval")
    def decide_approval(self, decision: ApprovalDecision) -> str:
        """`spillway approve|reject`: like the signal, but a refusal reaches the caller."""
        self._pending = decision
        return "approved" if decision.approved else "rejected"

    @decide_approval.validator
    def _validate_approval(self, decision: ApprovalDecision) -> None:
        refusal = self._refusal(decision)
        if refusal is not None:
            raise ValueError(refusal)

    def _refusal(self, decision: ApprovalDecision) -> str | None:
        if self._plan.state != "awaiting_approval":
            return f"job {self._job.job_id} is not awaiting approval (state: {self._plan.state})"
        if self._pending is not None:
            return f"job {self._job.job_id} already has a decision by {self._pending.by}"
        if decision.approved and self._job.cloud is None:
            return f"job {self._job.job_id} has no cloud prompt: it can only run locally"
        return None

    # --- deciding ----------------------------------------------------------------------------

    async def _read_policy(self) -> Policy:
        self._publish()
        policy: Policy = await workflow.execute_activity(
            "read_policy",
            PolicyRequest(job_id=self._job.job_id),
            result_type=Policy,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=FREE_RETRY,
        )
        return policy

    async def _route(self, job: VideoJob, policy: Policy) -> tuple[Route, str]:
        """Returns the route and, for the cloud, who authorised the spending."""
        if job.carry is not None:
            carry = job.carry
            return await self._wait(policy, carry.approval_deadline, carry.give_up_at)
        load = await self._probe()
        if not load.reachable:
            # One network blip never moves a job: "unreachable" needs a second silent probe.
            await workflow.sleep(timedelta(seconds=policy.unreachable_confirm_s))
            load = await self._probe()
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
            return "local", ""
        if decision.route == "cloud":
            return "cloud", "armed"
        now = workflow.now()
        self._plan.state = "awaiting_approval"
        self._notify(policy, now + timedelta(seconds=policy.approval_timeout_s))
        return await self._wait(
            policy,
            approval_deadline=now + timedelta(seconds=policy.approval_timeout_s),
            give_up_at=now + timedelta(seconds=policy.unreachable_give_up_s),
        )

    async def _wait(
        self, policy: Policy, approval_deadline: datetime, give_up_at: datetime
    ) -> tuple[Route, str]:
        """AWAIT: approval, rejection, timeout or headroom, re-probing every recheck interval.
        Once the approval window is over (state `probing`), wait only for ComfyUI to answer."""
        self._publish()
        loops = 0
        while True:
            if self._pending is not None:
                decision, self._pending = self._pending, None
                self._plan.approval = ApprovalRecord(**decision.model_dump(), at=workflow.now())
                if decision.approved:
                    if not policy.key_present:
                        self._fail(texts.approved_without_key(decision.by))
                    return "cloud", decision.by
                self._plan.reasons = [*self._plan.reasons, f"rejected_by={decision.by}"]
                self._plan.state = "probing"  # rejected: local as soon as ComfyUI answers
            reachable = self._last_reachable()
            now = workflow.now()
            if self._plan.state == "awaiting_approval" and now >= approval_deadline:
                self._plan.reasons = [*self._plan.reasons, "approval_timeout"]
                self._plan.state = "probing"  # a timeout never means "spend"
            if self._plan.state == "probing" and reachable:
                return "local", ""
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
            load = await self._probe()
            if load.reachable and not load.overloaded:
                self._plan.reasons = [*self._plan.reasons, "headroom_returned"]
                self._plan.overflow.last_signal = load
                return "local", ""
            self._record_signal(load)

    def _continue_as_new(
        self, policy: Policy, approval_deadline: datetime, give_up_at: datetime
    ) -> NoReturn:
        carry = AwaitCarry(
            plan=self._plan,
            policy=policy,
            approval_deadline=approval_deadline,
            give_up_at=give_up_at,
            pending_approval=self._pending,
        )
        workflow.continue_as_new(self._job.model_copy(update={"carry": carry}))

    async def _probe(self) -> LoadStatus:
        load: LoadStatus = await workflow.execute_activity(
            "a40_load_status",
            LoadProbeRequest(job_id=self._job.job_id),
            result_type=LoadStatus,
            start_to_close_timeout=timedelta(seconds=90),
            retry_policy=FREE_RETRY,
        )
        return load

    def _record_signal(self, load: LoadStatus) -> None:
        """Keeps the latest measurement that explains why the job still waits."""
        self._plan.overflow.last_signal = load
        if load.reachable and self._plan.overflow.trigger == "unreachable":
            self._plan.overflow.trigger = "overloaded"

    def _last_reachable(self) -> bool:
        signal = self._plan.overflow.last_signal
        return signal is None or signal.reachable

    def _notify(self, policy: Policy, decide_by: datetime) -> None:
        if not policy.webhook_configured:
            return
        notice = texts.approval_notice(self._plan, policy, workflow.info().namespace, decide_by)
        self._notify_task = asyncio.create_task(self._send_notice(notice))

    async def _send_notice(self, notice: ApprovalNotice) -> None:
        try:
            await workflow.execute_activity(
                "notify_approval_needed",
                notice,
                start_to_close_timeout=timedelta(seconds=30),
                retry_policy=RetryPolicy(maximum_attempts=5, initial_interval=timedelta(seconds=2)),
            )
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
            await workflow.execute_activity(
                "comfyui_submit",
                ComfyUISubmit(
                    job_id=self._job.job_id,
                    prompt_id=prompt_id,
                    client_id=client_id,
                    graph=self._job.graph,
                ),
                result_type=ComfyUISubmitted,
                # Short, so a worker that died mid-submit is replaced quickly: a retried submit
                # looks for its prompt_id in ComfyUI before posting, so it never posts twice.
                start_to_close_timeout=max(2 * self._heartbeat, timedelta(seconds=10)),
                retry_policy=RetryPolicy(
                    maximum_interval=timedelta(seconds=30),
                    non_retryable_error_types=["ComfyUIGraphRejected"],
                ),
            )
            finished: ComfyUIFinished = await workflow.execute_activity(
                "comfyui_wait",
                ComfyUIWait(job_id=self._job.job_id, prompt_id=prompt_id, client_id=client_id),
                result_type=ComfyUIFinished,
                start_to_close_timeout=timedelta(hours=24),
                heartbeat_timeout=self._heartbeat,
                retry_policy=RetryPolicy(
                    maximum_interval=timedelta(seconds=30),
                    non_retryable_error_types=["ComfyUIExecutionFailed", "ComfyUIInterrupted"],
                ),
            )
            if finished.outcome == "lost":
                # ComfyUI restarted and forgot the prompt: resubmitting locally costs nothing.
                self._plan.reasons = [*self._plan.reasons, f"comfyui_lost_prompt={prompt_id}"]
                continue
            downloaded: Downloaded = await workflow.execute_activity(
                "comfyui_download",
                ComfyUIDownload(job_id=self._job.job_id, files=finished.files),
                result_type=Downloaded,
                start_to_close_timeout=timedelta(hours=6),
                heartbeat_timeout=self._heartbeat,
                retry_policy=FREE_RETRY,
            )
            self._plan.outputs = downloaded.outputs
            return
        self._fail(texts.lost_too_often(self._plan.local_attempts))

    async def _cancel_local_prompt(self) -> None:
        if self._plan.route != "local" or self._plan.prompt_id is None:
            return
        # A job shows `cancelled` only once ComfyUI no longer holds its prompt.
        cancelled: ComfyUICancelled = await workflow.execute_activity(
            "comfyui_cancel",
            ComfyUICancel(prompt_id=self._plan.prompt_id),
            result_type=ComfyUICancelled,
            start_to_close_timeout=timedelta(minutes=10),
            heartbeat_timeout=self._heartbeat,
            retry_policy=FREE_RETRY,
        )
        self._plan.reasons = [*self._plan.reasons, f"comfyui_prompt_{cancelled.was}_cancelled"]

    # --- CLOUD ---------------------------------------------------------------------------------

    async def _run_cloud(self, policy: Policy, authorised_by: str) -> None:
        request = self._job.cloud
        if request is None:  # decide() and the approval checks make this unreachable
            self._fail(f"job {self._job.job_id} has no cloud prompt: it can only run locally")
        cost = policy.estimated_costs_usd.get(f"{request.resolution}/{request.duration}s")
        self._plan.route = "cloud"
        self._plan.cloud = CloudInfo(authorised_by=authorised_by, estimated_cost_usd=cost)
        self._set_state("running_cloud")
        self._create_started = workflow.now()
        created: MiniMaxCreated = await workflow.execute_activity(
            "minimax_create",
            MiniMaxCreate(job_id=self._job.job_id, request=request),
            result_type=MiniMaxCreated,
            start_to_close_timeout=timedelta(minutes=10),
            heartbeat_timeout=self._heartbeat,
            retry_policy=NEVER_RETRY,
        )
        # From here on the task id is in history: no crash or retry can lead to a second create.
        self._plan.cloud.task_id = created.task_id
        self._publish()
        done: MiniMaxDone = await workflow.execute_activity(
            "minimax_poll",
            MiniMaxPoll(job_id=self._job.job_id, task_id=created.task_id),
            result_type=MiniMaxDone,
            start_to_close_timeout=timedelta(hours=24),
            heartbeat_timeout=self._heartbeat,
            retry_policy=RetryPolicy(
                maximum_interval=timedelta(seconds=60),
                non_retryable_error_types=["MiniMaxTaskFailed", "MiniMaxPermanent"],
            ),
        )
        downloaded: Downloaded = await workflow.execute_activity(
            "minimax_download",
            MiniMaxDownload(job_id=self._job.job_id, task_id=created.task_id, file_id=done.file_id),
            result_type=Downloaded,
            start_to_close_timeout=timedelta(hours=2),
            heartbeat_timeout=self._heartbeat,
            retry_policy=RetryPolicy(
                maximum_interval=timedelta(seconds=60),
                non_retryable_error_types=["MiniMaxPermanent"],
            ),
        )
        self._plan.outputs = downloaded.outputs

    # --- what people see -------------------------------------------------------------------------

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
        if err.activity_type == "minimax_create" and isinstance(cause, ActivityTimeout):
            return texts.ambiguous_create(self._plan, self._create_started)
        if isinstance(cause, ApplicationError | ActivityTimeout):
            return cause.message
        return str(cause or err)


def _authorisation(route: Route, authorised_by: str) -> str:
    if route == "local":
        return "none"
    return "armed" if authorised_by == "armed" else "approved"
