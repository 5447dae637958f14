"""VideoJobWorkflow's state in one structure, `VideoJobState`, and what every part of the
workflow does with it: read the job's input (so that input no client should have sent fails the
job at once, naming each bad field, instead of a workflow task that retries forever), publish
the plan (memo for `spillway status`, search attributes for lists, current details for the UI),
fail the job, and count where it went. Workflow code.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, NoReturn

from pydantic import ValidationError
from temporalio import workflow
from temporalio.common import Priority, RawValue, SearchAttributeUpdate
from temporalio.exceptions import ActivityError, ApplicationError
from temporalio.exceptions import TimeoutError as ActivityTimeout

from workflows.timers import Alarms

with workflow.unsafe.imports_passed_through():
    from spillway.core import names
    from spillway.core import search_attributes as sa
    from spillway.core.decision import Seen
    from spillway.core.gpu_pool import PoolAnswer
    from spillway.core.ledger import Authorisation, Reservation
    from spillway.core.models import (
        ApprovalDecision,
        AwaitCarry,
        HostCapabilities,
        HostRef,
        JobPlace,
        JobState,
        LoadStatus,
        Plan,
        Policy,
        Preemption,
        RenderProgress,
        VideoJob,
    )
    from spillway.core.settings import describe_validation_error
    from workflows import texts

FAILED = "JobFailed"  # the type of the failure a failed job ends with
# Runs of 0.2.0 carry ids made of the run id's first 8 characters: their prompts and callbacks
# keep them.
IDS_PER_RUN = "ids-per-run"
# Runs of 0.2.0 and 0.3.0 use a decision without asking a worker whether its signature holds.
SIGNED_APPROVALS = "signed-approvals"


def run_tag() -> str:
    """This run's part of the ids that must differ between runs of one job."""
    run_id = workflow.info().run_id
    return names.run_tag(run_id) if workflow.patched(IDS_PER_RUN) else run_id[:8]


@dataclass(frozen=True)
class RouteChoice:
    """Where a job goes and, for the cloud, who allowed it: `authorisation` says how (armed,
    approved, approved over the budget), `by` who ("armed" or the approver's name, as the
    JSON contract's `cloud.authorised_by` shows it)."""

    route: Literal["local", "cloud"]
    authorisation: Authorisation | None = None
    by: str | None = None
    reservation: Reservation | None = None

    @property
    def metric_label(self) -> str:
        if self.route == "local":
            return "none"
        return "armed" if self.authorisation == "armed" else "approved"


LOCAL = RouteChoice("local")
ARMED = RouteChoice("cloud", authorisation="armed", by="armed")


@dataclass
class Ticket:
    """A decision accepted by the signal or the update, until the workflow has used it (answer)
    or found it cannot (refusal); the update returns or raises what it ends with."""

    decision: ApprovalDecision
    answer: str | None = None
    refusal: str | None = None

    @property
    def settled(self) -> bool:
        return self.answer is not None or self.refusal is not None


@dataclass
class VideoJobState:
    job: VideoJob
    plan: Plan
    input_error: str | None = None  # why the input is not a job: it fails at once
    # Set on a run this workflow continued as new: the wait for a person goes on.
    carry: AwaitCarry | None = None
    worker_policy: Policy | None = None  # what the workers decide with, read first thing
    pending: Ticket | None = None  # a person's decision, until it is used
    approval_deadline: datetime = datetime.max  # decisions are judged against it
    next_host: str | None = None  # where the latest measurement would run it locally
    readings: dict[str, LoadStatus] = field(default_factory=dict)  # the latest, per host
    pooled: bool = False  # a run of 0.5.0 on: it decides with the GPU pool (admission.GPU_POOL)
    place: JobPlace | None = None  # its ask for a GPU place: in the line, or holding one
    # The GPU hosts known to lack what its graph needs, as their agents read their ComfyUI
    # (measure.fits); None: not asked (a run of 0.5.0). A host added since is not among them.
    unfit: list[str] | None = None
    # What each host has, in brief, as the fit found it: the job's first ask brings it to the
    # pool (`spillway queue`). Not carried across continue-as-new.
    hosts_have: dict[str, HostCapabilities] = field(default_factory=dict)
    # A `spillway priority` change the run has not yet asked the pool for.
    reprioritized: bool = False
    render_s: float | None = None  # its render, by ComfyUI's clock: the pool's ETA learns it
    progress: RenderProgress | None = None  # its render's, as the wait relays it (UI details)
    # An armed job waiting in the line by its patience: it goes to the cloud then, or once the
    # pool says the line's estimate passed it (`late`).
    patience_until: datetime | None = None
    late: bool = False
    answer: PoolAnswer | None = None  # the pool's answer to the ask just sent
    # The pool's word that its place goes to a more urgent job: the render is taken out of
    # ComfyUI and the place given back (local_route), unless the render ended first.
    preempt: Preemption | None = None
    # What the job decided on, so that a refusal of the ledger later (the budget, a disarmed
    # fallback) changes its quote by the same rules. Not carried across continue-as-new.
    seen: Seen | None = None
    # Ask times of places the pool gave to asks the job no longer stands by: the run gives them
    # back, never the signal handler that learnt of them.
    strays: list[datetime] = field(default_factory=list)
    # False from its prompt's POST until the job knows ComfyUI let go of it: a place left
    # meanwhile (host lost, cancel, failure) is freed only once the pool has taken it out.
    prompt_out: bool = True
    ignored: int = 0  # signals recorded as ignored in this run: each wakes a waiting job
    create_started: datetime = datetime.min
    unused_reservation: bool = False  # reserved, and no create started for it yet
    published: str = ""  # the plan as last published: a publication that changes nothing is skipped
    notice: asyncio.Task[None] | None = field(default=None, repr=False)  # the approval webhook
    alarms: Alarms = field(default_factory=Alarms, repr=False)

    @classmethod
    def of(cls, raw: RawValue) -> VideoJobState:
        """The state a run starts with, from its raw input."""
        info = workflow.info()
        read = _read_job(raw)
        if isinstance(read, str):
            job = VideoJob.model_construct(
                job_id=info.workflow_id, graph={}, cloud=None, carry=None
            )
            return cls(job=job, plan=Plan(job_id=job.job_id), input_error=read)
        # `carry` is honoured only on a run continued by this workflow itself: a client that
        # starts a job with a hand-made one gets no shortcut past the probe and the approval.
        carry = read.carry if info.continued_run_id is not None else None
        if carry is None:
            state = cls(job=read, plan=Plan(job_id=read.job_id))
            if read.carry is not None:
                state.input_error = (
                    "`carry` is set by continue-as-new only: start the job without it"
                )
            state.published = state._published_at_start()
            return state
        pending = carry.pending_approval
        return cls(
            job=read,
            plan=carry.plan,
            carry=carry,
            worker_policy=carry.policy,
            pending=Ticket(pending) if pending else None,
            approval_deadline=carry.approval_deadline,
            pooled=carry.place is not None,
            place=carry.place,
            unfit=carry.place.unfit if carry.place else None,
            patience_until=carry.patience_until,
        )

    # --- what the policy says, once read ------------------------------------------------------

    @property
    def policy(self) -> Policy:
        assert self.worker_policy is not None, "the policy is read first thing in a run"
        return self.worker_policy

    @property
    def heartbeat(self) -> timedelta:
        """How soon a dead worker's long activity moves to another worker (at most 30 s)."""
        return timedelta(seconds=self.policy.heartbeat_timeout_s)

    @property
    def host_lost(self) -> timedelta:
        """How long a host may stay silent under the job, and the bound on its agent picking
        up a submit or a wait."""
        return timedelta(seconds=self.policy.host_lost_after_s)

    @property
    def priority(self) -> Priority:
        """The job's activities queue by the job's priority (1 first), whichever client
        started it and whether or not it set the workflow's own."""
        return Priority(priority_key=self.job.priority)

    def host_named(self, name: str | None) -> HostRef:
        """The host to run on: the one named, else the first."""
        hosts = self.policy.hosts
        return next((h for h in hosts if h.name == name), hosts[0])

    # --- the plan, as people and tools see it ---------------------------------------------------

    def set_state(self, state: JobState) -> None:
        self.plan.state = state
        self.publish()

    def reason(self, reason: str) -> None:
        self.plan.reasons = [*self.plan.reasons, reason]

    def publish(self) -> None:
        plan = self.plan
        snapshot = plan.model_dump_json()
        if snapshot == self.published:  # every upsert is a history event: skip no-ops
            return
        self.published = snapshot
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
        workflow.upsert_memo({names.PLAN_MEMO: plan, names.PRIORITY_MEMO: self.job.priority})
        workflow.set_current_details(texts.current_details(plan, self.progress))

    def _published_at_start(self) -> str:
        """The plan's snapshot when the job's start already carries what its first publication
        would upsert (spillway's own clients start jobs so: spillway/client/jobs.py), so that the
        first workflow task upserts nothing: each upsert is two history events and two
        visibility writes. "" otherwise (another client: the job publishes at its first step)."""
        try:
            plan = workflow.memo_value(names.PLAN_MEMO, None, type_hint=Plan)
            priority = workflow.memo_value(names.PRIORITY_MEMO, None)
        except Exception:  # a raw client's memo may hold anything
            return ""
        started = workflow.info().typed_search_attributes
        if (
            plan != self.plan
            or priority != self.job.priority
            or started.get(sa.STATE) != self.plan.state
            # The team is the start's alone: no publication upserts it.
            or any(started.get(key) is not None for key in sa.ALL if key not in (sa.STATE, sa.TEAM))
        ):
            return ""
        workflow.set_current_details(texts.current_details(self.plan))
        return self.plan.model_dump_json()

    def count(self, choice: RouteChoice) -> None:
        workflow.metric_meter().create_counter(
            "spillway_jobs_routed", "jobs by the route they took and who allowed the cloud"
        ).add(
            1,
            {
                "route": choice.route,
                "authorised": choice.metric_label,
                "host": self.plan.host or "-",
                "provider": self.plan.cloud.provider if self.plan.cloud else "-",
            },
        )

    # --- failing -----------------------------------------------------------------------------

    def fail(self, message: str) -> NoReturn:
        self.plan.error = message
        self.set_state("failed")
        raise ApplicationError(message, type=FAILED, non_retryable=True)


def failure_message(err: ActivityError) -> str:
    cause = err.cause
    if isinstance(cause, ApplicationError | ActivityTimeout):
        return cause.message
    return str(cause or err)


def _read_job(raw: RawValue) -> VideoJob | str:
    """The job, or why it is not one (any language, any SDK may start one)."""
    try:
        value: Any = workflow.payload_converter().from_payload(raw.payload)
    except Exception as exc:  # any converter error: the payload is not JSON
        return f"invalid job input: not JSON ({type(exc).__name__})"
    try:
        job = VideoJob.model_validate(value)
    except ValidationError as exc:
        return describe_validation_error(exc, "job input")
    if job.job_id != workflow.info().workflow_id:
        return (
            f"invalid job input: job_id {job.job_id!r} is not the workflow id "
            f"{workflow.info().workflow_id!r}: start the workflow with id = job_id"
        )
    return job
