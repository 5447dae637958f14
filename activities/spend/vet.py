"""What the spend ledger learns for itself before it changes anything (docs/design.md, "The spend
ledger and the budget", Authority): an activity of SpendLedgerWorkflow, on a queue of its own
beside the ledger's (`spillway.core.names.vet_queue`), that vets every request the ledger's inbox
held, in one go.

Anyone who can reach the namespace can send the ledger an update, so a request is believed only
as far as Temporal confirms it: the run it names must be a `VideoJobWorkflow` of that job id,
running on spillway's own task queue, and must be running the very activity that asks (a
reservation from `spend_reserve`, a create's begin from the provider's create activity, a
settle from one of those or `spend_settle`). An approval must be the job's own: with
SPILLWAY_APPROVAL_SECRET on the workers, a decision the job's own history holds (its `approval`
signals, its accepted `decide_approval` updates, the one its run was carried) signed for this
job incarnation, the provider asked and the clip's cost key, and not expired; without it, as the
job's plan shows it. The cost comes from routing_tiers.json for the job's own clip (its input,
read off its history), the incarnation from Temporal's first run id. A budget order must be
signed with SPILLWAY_LEDGER_SECRET for this ledger, and fresh (ledger_seal.py); the book keeps
the budgets and refuses an order older than the one in force. A ledger run made by a reset is
handed what the run it was reset from held, once.

Only a worker that holds SPILLWAY_LEDGER_SECRET serves this queue (activities/registry.py), and
one that somehow has no secret decides nothing: it cannot tell a ledger spillway started from a
forged one, nor a budget order from a forgery.
"""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ValidationError
from temporalio import activity
from temporalio.api.common.v1 import Payload
from temporalio.api.enums.v1 import WorkflowExecutionStatus
from temporalio.api.history.v1 import HistoryEvent
from temporalio.api.workflow.v1 import PendingActivityInfo
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from activities.cloud import registry
from activities.spend.history import held_before_reset, not_made_by_spillway, reset_base
from spillway.core import approvals, names
from spillway.core.ledger import Authorisation, BudgetOrder, Budgets, LedgerInput, Vetted
from spillway.core.ledger_seal import why_not_signed
from spillway.core.models import ApprovalDecision, CloudRequest, Plan, VideoJob
from spillway.core.settings import Settings
from spillway.core.spend_book import APPROVAL_REFUSED, BUDGET_ORDER_REFUSED, REFUSED, SpendBook
from spillway.core.teams import load_teams
from spillway.core.tiers import RoutingTiers

Purpose = Literal["reserve", "begin", "settle", "terms", "budget"]


class TokenNotShownYet(Exception):
    """A begin vetted before its create attempt's first heartbeat reached the server."""


class VetRequest(BaseModel):
    purpose: Purpose
    job_id: str = ""
    run_id: str = ""
    provider: str = ""
    authorisation: Authorisation = "armed"
    authorised_by: str = ""
    team: str | None = None  # a reservation's: the team the job believes it belongs to
    attempt: str = ""  # a begin's: run id / activity id / attempt of the create that begins
    token: str = ""  # a begin's: the hash its create attempt shows in its heartbeat
    order: BudgetOrder | None = None  # a budget's: the signed order


class VetBatch(BaseModel):
    """The requests the ledger took from its inbox, in arrival order."""

    requests: list[VetRequest]
    # The run the asking ledger run was reset from whose book it took over already (None: none).
    reset_held: str | None = None


class ResetBook(BaseModel):
    """What the run a ledger run was reset from held when it ended (with its continue-as-new
    successors'), compacted as a continue-as-new carries it: the reset run holds it before it
    grants anything."""

    base_run: str
    held: LedgerInput


class VetAnswers(BaseModel):
    """One answer per request, in the same order."""

    answers: list[Vetted]
    # Set once for a ledger run made by a reset (until it says it holds this book).
    reset: ResetBook | None = None


# Ledger runs whose origin (and reset) a worker remembers (one at a time runs; a few across
# resets).
TRUST_REMEMBERED = 16
# Describes, queries and history reads a batch may have in flight at once (300 jobs racing
# put 300 requests in one batch).
VET_CONCURRENCY = 20


UNCHECKED_SEAL = (
    "the worker that vetted it holds no SPILLWAY_LEDGER_SECRET, so it cannot check the spend "
    "ledger's seal: nothing was decided (only workers with the secret should serve {queue})"
)


def budgets_of(settings: Settings) -> Budgets:
    return Budgets(
        daily_usd=settings.CLOUD_DAILY_BUDGET_USD, monthly_usd=settings.CLOUD_MONTHLY_BUDGET_USD
    )


def estimate_usd(
    tiers: RoutingTiers, settings: Settings, provider_name: str, request: CloudRequest
) -> float | None:
    """The planning figure of routing_tiers.json for this provider and clip (None: none known)."""
    tier = tiers.by_provider(provider_name)
    provider = registry.PROVIDERS.get(provider_name)
    if tier is None or provider is None:
        return None
    return tier.estimated_cost_usd.get(provider.cost_key(request, settings))


def asking_activities(purpose: Purpose) -> frozenset[str]:
    creates = {p.create_activity for p in registry.PROVIDERS.values()}
    if purpose == "reserve":
        return frozenset({names.SPEND_RESERVE})
    if purpose == "begin":
        return frozenset(creates)
    return frozenset({names.SPEND_SETTLE, *creates})


class LedgerVetting:
    def __init__(self, client: Client, settings: Settings, tiers: RoutingTiers) -> None:
        self._client, self._settings, self._tiers = client, settings, tiers
        # Whose budget a job's spending counts in besides the studio's: its input's team, or
        # the default one.
        self._teams = load_teams(settings.SPILLWAY_TEAMS_FILE)
        self._untrusted: dict[str, str | None] = {}  # ledger run id -> why it grants nothing
        self._reset_base: dict[str, str | None] = {}  # ledger run id -> the run it was reset from
        self._reset_books: dict[str, LedgerInput] = {}  # that run -> what it held

    @activity.defn(name=names.LEDGER_VET)
    async def vet(self, batch: VetBatch) -> VetAnswers:
        gate = asyncio.Semaphore(VET_CONCURRENCY)
        base = Vetted(
            budgets=budgets_of(self._settings), ledger_run=activity.info().workflow_run_id
        )

        def failed(exc: Exception) -> Vetted:
            return base.model_copy(update={"failed": f"{type(exc).__name__}: {exc}"})

        if self._settings.SPILLWAY_LEDGER_SECRET is None:
            # Fails closed, and as "not decided" rather than "untrusted": a refusal would mark
            # the ledger itself untrusted, and a run that continues carries that for good.
            why = UNCHECKED_SEAL.format(queue=activity.info().task_queue)
            activity.logger.warning("spend ledger: %s", why)
            return VetAnswers(
                answers=[base.model_copy(update={"failed": why})] * len(batch.requests)
            )
        try:
            untrusted = await self._ledger_untrusted()
        except Exception as exc:  # nothing is decided: the callers ask again
            activity.logger.warning("spend ledger could not read its own start: %s", exc)
            return VetAnswers(answers=[failed(exc)] * len(batch.requests))
        if untrusted is not None:
            activity.logger.warning("spend ledger refuses everything: %s", untrusted)
            refused = {"refused": untrusted, "refused_kind": "untrusted", "ledger_trusted": False}
            return VetAnswers(answers=[base.model_copy(update=refused)] * len(batch.requests))
        try:
            reset = await self._reset_book(batch.reset_held)
        except Exception as exc:  # granting on a book that misses the reset's past: never
            activity.logger.warning("spend ledger could not read what it held before: %s", exc)
            return VetAnswers(answers=[failed(exc)] * len(batch.requests))

        async def one(req: VetRequest) -> Vetted:
            async with gate:
                try:
                    return await self._vet(req)
                except Exception as exc:  # one request's trouble never fails the others
                    activity.logger.warning("spend ledger could not vet a %s: %s", req.purpose, exc)
                    return failed(exc)

        answers = await asyncio.gather(*(one(r) for r in batch.requests))
        return VetAnswers(answers=answers, reset=reset)

    async def _reset_book(self, held: str | None) -> ResetBook | None:
        """For a ledger run made by a reset, what the run it was reset from held, unless it
        says it holds that already. Whether a run was reset is read once per run (its history
        shows it, and a run is never reset later: a reset makes a new run)."""
        info = activity.info()
        run_id, ledger_id = info.workflow_run_id, info.workflow_id
        if run_id is None or ledger_id is None:
            return None
        if run_id not in self._reset_base:
            handle = self._client.get_workflow_handle(ledger_id, run_id=run_id)
            _forget_oldest(self._reset_base)
            self._reset_base[run_id] = await reset_base(handle)
        base = self._reset_base[run_id]
        if base is None or base == held:
            return None
        if base not in self._reset_books:
            _forget_oldest(self._reset_books)
            before = await held_before_reset(self._client, ledger_id, base, run_id)
            book = SpendBook.of(before)
            self._reset_books[base] = book.carried(datetime.now(UTC), before.updates_per_run)
        return ResetBook(base_run=base, held=self._reset_books[base])

    async def _vet(self, req: VetRequest) -> Vetted:
        terms = Vetted(
            budgets=budgets_of(self._settings), ledger_run=activity.info().workflow_run_id
        )
        if req.purpose == "terms":
            return terms
        if req.purpose == "budget":
            return self._order(req, terms)
        why, incarnation = await self._caller(req)
        if why is not None:
            activity.logger.warning(
                "spend ledger refused a %s for %s: %s", req.purpose, req.job_id, why
            )
            return terms.model_copy(update={"refused": why})
        terms.incarnation = incarnation
        if req.purpose != "reserve":
            return terms
        s = self._settings
        # Keys and arming are the asking worker's to check (`spend_reserve`, then the create):
        # the worker that vets may hold no key at all.
        if req.provider not in registry.PROVIDERS:
            return terms.model_copy(update={"refused": f"no cloud provider {req.provider!r}"})
        job, decisions = await self._history(req)
        if job is None or job.cloud is None:
            return terms.model_copy(update={"refused": "the job has no cloud request"})
        team = job.team or self._teams.default
        if req.team is not None and req.team != team:
            # A request that names another team than the job's input (forged, or workers that
            # read different teams files) would charge the wrong budget: nothing is granted.
            why = f"job {req.job_id} is team {team}'s, not team {req.team}'s"
            return terms.model_copy(update={"refused": why})
        terms.team = team
        if req.authorisation != "armed":
            secret = s.SPILLWAY_APPROVAL_SECRET
            if secret is None:
                why = await self._approval(req)
            else:
                binding = approvals.Binding(
                    job_id=req.job_id,
                    incarnation=incarnation or "",
                    provider=req.provider,
                    cost_key=registry.cost_key(req.provider, job.cloud, s),
                )
                why, signed = _signed(secret.get_secret_value(), req, binding, decisions)
                if signed is not None:
                    terms.approval = approvals.digest(signed)
                    terms.approval_until = signed.expires_at
            if why is not None:
                refused = {"refused": why, "refused_kind": APPROVAL_REFUSED}
                return terms.model_copy(update=refused)
        terms.cost_usd = estimate_usd(self._tiers, s, req.provider, job.cloud)
        terms.created_earlier = await self._created_earlier(req, incarnation)
        return terms

    def _order(self, req: VetRequest, terms: Vetted) -> Vetted:
        """A budget order, believed only when signed for this ledger just now."""
        secret = self._settings.SPILLWAY_LEDGER_SECRET
        assert secret is not None  # `vet` decides nothing without it
        why = (
            "it carries no order"
            if req.order is None
            else why_not_signed(
                secret.get_secret_value(),
                activity.info().workflow_id or "",
                req.order,
                datetime.now(UTC),
            )
        )
        if why is None:
            return terms
        activity.logger.warning("spend ledger refused a budget order: %s", why)
        return terms.model_copy(
            update={"refused": f"budget order: {why}", "refused_kind": BUDGET_ORDER_REFUSED}
        )

    async def _ledger_untrusted(self) -> str | None:
        """Why the ledger run that asks must grant nothing: it is not a run spillway made
        (activities/spend/history.py). Read once per run."""
        secret = self._settings.SPILLWAY_LEDGER_SECRET
        info = activity.info()
        if secret is None or info.workflow_id is None or info.workflow_run_id is None:
            # Never "trusted" for want of a check: the caller hears that nothing was decided.
            raise RuntimeError("no SPILLWAY_LEDGER_SECRET, or no ledger run, to check the seal of")
        run_id = info.workflow_run_id
        if run_id not in self._untrusted:
            why = await not_made_by_spillway(
                self._client, info.workflow_id, run_id, secret.get_secret_value()
            )
            _forget_oldest(self._untrusted)
            self._untrusted[run_id] = why
        why = self._untrusted[run_id]
        if why is None:
            return None
        return (
            f"this spend ledger run was not started by spillway ({why}): it grants nothing; "
            "terminate it and run `spillway ledger restore` with SPILLWAY_LEDGER_SECRET set"
        )

    async def _caller(self, req: VetRequest) -> tuple[str | None, str | None]:
        """(why the request is not spillway's own job's, the job's incarnation)."""
        handle = self._client.get_workflow_handle(req.job_id, run_id=req.run_id or None)
        try:
            described = await handle.describe()
        except RPCError as exc:
            if exc.status in (RPCStatusCode.NOT_FOUND, RPCStatusCode.INVALID_ARGUMENT):
                return f"no run {req.run_id} of workflow {req.job_id}", None
            raise
        raw = described.raw_description
        info = raw.workflow_execution_info
        if not req.run_id or info.execution.run_id != req.run_id:
            return f"run {req.run_id!r} is not a run of job {req.job_id}", None
        if info.type.name != names.VIDEO_JOB:
            return f"{req.job_id} is a {info.type.name}, not a spillway job", None
        # The ledger schedules this on its vetting queue (names.vet_queue).
        queue = activity.info().task_queue.removesuffix(names.VET_SUFFIX)
        if info.task_queue != queue:
            return f"job {req.job_id} runs on task queue {info.task_queue!r}, not {queue!r}", None
        if info.status != WorkflowExecutionStatus.WORKFLOW_EXECUTION_STATUS_RUNNING:
            return f"run {req.run_id} of job {req.job_id} is not running", None
        wanted = asking_activities(req.purpose)
        asking = [p for p in raw.pending_activities if p.activity_type.name in wanted]
        if not asking:
            names_ = " or ".join(sorted(wanted))
            return f"run {req.run_id} of job {req.job_id} is not running {names_}", None
        attempts = {f"{req.run_id}/{p.activity_id}/{p.attempt}": p for p in asking}
        if req.purpose == "begin":
            create = attempts.get(req.attempt)
            if create is None:
                # Only the attempt Temporal shows running may begin: a begin naming another one
                # would leave the real create refused and its entry held for good.
                return f"attempt {req.attempt!r} is not the create job {req.job_id} runs now", None
            shown = await self._shown_token(create)
            if shown is None:
                # Its first beat is on its way: nothing is decided, the begin is asked again.
                raise TokenNotShownYet(f"create attempt {req.attempt} shows no token yet")
            if shown != req.token:
                return f"the begin's token is not the one create attempt {req.attempt} shows", None
        return None, info.first_run_id or info.execution.run_id

    async def _shown_token(self, create: PendingActivityInfo) -> str | None:
        """The token in a pending create's latest heartbeat (guard.Beginning)."""
        payloads = create.heartbeat_details.payloads
        if not payloads:
            return None
        (details,) = await self._client.data_converter.decode(payloads[:1])
        token = details.get("token") if isinstance(details, dict) else None
        return token if isinstance(token, str) else None

    async def _approval(self, req: VetRequest) -> str | None:
        """Why the job's own plan does not show the approval the request claims (workers
        without SPILLWAY_APPROVAL_SECRET: anyone who can signal the namespace can approve)."""
        handle = self._client.get_workflow_handle(req.job_id, run_id=req.run_id)
        plan: Plan = await handle.query(names.PLAN_QUERY, result_type=Plan)
        approval = plan.approval
        if approval is None or not approval.approved or approval.by != req.authorised_by:
            return f"job {req.job_id} shows no approval by {req.authorised_by}"
        if req.authorisation == "approved_over_budget" and not approval.over_budget:
            return f"job {req.job_id}'s approval by {approval.by} is not over the budget"
        return None

    async def _created_earlier(self, req: VetRequest, incarnation: str | None) -> bool:
        """Whether another run of the job's incarnation ordered a cloud task (its create) or
        followed one (its poll). The ledger's tags of created jobs are carried for KEEP only,
        while a run can be reset as long as the namespace keeps it, and each reset run refused
        for a task follows it, so the evidence passes down a chain of resets. A server that
        cannot list runs (the time-skipping test server) leaves it to the tags."""
        wanted = {
            n for p in registry.PROVIDERS.values() for n in (p.create_activity, p.poll_activity)
        }
        try:
            runs = [r async for r in self._client.list_workflows(f"WorkflowId = '{req.job_id}'")]
        except RPCError as exc:
            if exc.status == RPCStatusCode.UNIMPLEMENTED:
                return False
            raise
        for run in runs:
            if run.run_id == req.run_id or run.workflow_type != names.VIDEO_JOB:
                continue
            handle = self._client.get_workflow_handle(req.job_id, run_id=run.run_id)
            try:
                described = await handle.describe()
            except RPCError as exc:
                if exc.status == RPCStatusCode.NOT_FOUND:
                    continue  # deleted since it was listed: its visibility entry goes last
                raise
            info = described.raw_description.workflow_execution_info
            if (info.first_run_id or run.run_id) != incarnation:
                continue  # the job id used before: another incarnation's task is not this one's
            async for event in handle.fetch_history_events():
                if event.activity_task_scheduled_event_attributes.activity_type.name in wanted:
                    return True
                if await self._refused_as_created(event):
                    return True
        return False

    async def _refused_as_created(self, event: HistoryEvent) -> bool:
        """A reservation the ledger refused because a create went out, whose task the run could
        not follow: the evidence that run leaves for a reset of it."""
        failure = event.activity_task_failed_event_attributes.failure
        if failure.application_failure_info.type != REFUSED:
            return False
        payloads = failure.application_failure_info.details.payloads
        details = await self._client.data_converter.decode(payloads) if payloads else []
        return bool(details) and isinstance(details[0], dict) and details[0].get("kind") == "exists"

    async def _history(self, req: VetRequest) -> tuple[VideoJob | None, list[ApprovalDecision]]:
        """The run's own input (the clip the estimate is for) and every decision its history
        holds, in the order it got them: what the job was sent, not what a request claims. An
        armed reservation reads the input only."""
        handle = self._client.get_workflow_handle(req.job_id, run_id=req.run_id)
        job: VideoJob | None = None
        decisions: list[ApprovalDecision] = []
        page_size = 1 if req.authorisation == "armed" else 0
        async for event in handle.fetch_history_events(page_size=page_size):
            if event.HasField("workflow_execution_started_event_attributes"):
                payloads = event.workflow_execution_started_event_attributes.input.payloads
                if not payloads:
                    return None, []
                (job,) = await self._client.data_converter.decode(payloads, [VideoJob])
                assert isinstance(job, VideoJob)
                if job.carry is not None and job.carry.pending_approval is not None:
                    decisions.append(job.carry.pending_approval)
                if req.authorisation == "armed":
                    break
                continue
            decision = await self._decision(_decision_payload(event))
            if decision is not None:
                decisions.append(decision)
        return job, decisions

    async def _decision(self, payload: Payload | None) -> ApprovalDecision | None:
        if payload is None:
            return None
        try:
            (value,) = await self._client.data_converter.decode([payload])
            return ApprovalDecision.model_validate(value)
        except (ValidationError, ValueError, TypeError, RuntimeError):
            return None  # what the UI's "Send a Signal" may carry: no decision at all


def _forget_oldest(remembered: dict[str, Any]) -> None:
    if len(remembered) >= TRUST_REMEMBERED:
        remembered.pop(next(iter(remembered)))


def _decision_payload(event: HistoryEvent) -> Payload | None:
    """The decision an `approval` signal or an accepted `decide_approval` update carried."""
    if event.HasField("workflow_execution_signaled_event_attributes"):
        signaled = event.workflow_execution_signaled_event_attributes
        if signaled.signal_name == names.APPROVAL_SIGNAL and signaled.input.payloads:
            return signaled.input.payloads[0]
    if event.HasField("workflow_execution_update_accepted_event_attributes"):
        accepted = event.workflow_execution_update_accepted_event_attributes.accepted_request
        if accepted.input.name == names.DECIDE_UPDATE and accepted.input.args.payloads:
            return accepted.input.args.payloads[0]
    return None


def _signed(
    secret: str, req: VetRequest, binding: approvals.Binding, decisions: list[Any]
) -> tuple[str | None, ApprovalDecision | None]:
    """(why no decision of the job's history allows this reservation, the newest that does)."""
    over = req.authorisation == "approved_over_budget"
    why = f"job {req.job_id}'s history holds no approval by {req.authorised_by}"
    now = datetime.now(UTC)
    for decision in reversed(decisions):
        if not decision.approved or decision.by != req.authorised_by:
            continue
        if decision.over_budget != over:
            why = f"job {req.job_id}'s approval by {decision.by} does not say over the budget"
            continue
        problem = approvals.verify(secret, binding, decision, now)
        if problem is None:
            return None, decision
        why = (
            f"job {req.job_id}'s approval by {decision.by} is not signed for this job "
            f"incarnation, {req.provider} and clip {binding.cost_key} ({problem})"
        )
    return why, None
