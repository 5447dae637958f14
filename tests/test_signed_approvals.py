"""Signed approvals (SPILLWAY_APPROVAL_SECRET): the signature's table, then jobs whose workers hold
the secret. A decision as the Temporal UI sends it (unsigned), one changed after signing, one
signed for another job or with another secret and one expired are refused, recorded in the plan
and spend nothing; one signed by spillway.client spends once, and the secret is nowhere in the
job's history. Without the secret on the workers an unsigned decision still works (every other
approval test) and a signed one too. `health` says who can approve."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest
from temporalio import activity
from temporalio.client import WorkflowUpdateFailedError
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.exceptions import ApplicationError
from temporalio.worker import Replayer

from activities.approvals import ApprovalCheck, ApprovalVerdict
from spillway.cli.health import OPEN_TO_NAMESPACE, who_can_approve
from spillway.client import SpillwayClient
from spillway.client import jobs as client_jobs
from spillway.core import approvals
from spillway.core.errors import Failed
from spillway.core.models import ApprovalDecision, Plan
from spillway.core.names import APPROVAL_SIGNAL, APPROVAL_VERIFY, DECIDE_UPDATE
from tests.support.jobs import Jobs, RunJobs, history_text
from tests.support.route_stubs import BUSY, RouteStubs
from tests.support.settings import KEY, make_settings
from tests.test_video_job_workflow import HOUR
from worker import WORKFLOWS
from workflows.job_state import SIGNED_APPROVALS

SECRET = "approval-secret-75dae3c0598f44c5"  # distinctive: searched for in histories
OTHER_SECRET = "another-secret-1c9e04b27d3a6f58"
NOW = datetime(2025, 6, 1, 12, 0, tzinfo=UTC)
JOB = approvals.Binding(
    job_id="job-42", incarnation="0193-first-run", provider="minimax", cost_key="768P/6s"
)
DECISION = ApprovalDecision(approved=True, by="bär", reason="client deadline")
SIGNED = approvals.sign(SECRET, JOB, DECISION, NOW)
REJECTION = ApprovalDecision(approved=False, by="bär", reason="too expensive")
REJECTED = approvals.sign(SECRET, JOB, REJECTION, NOW)


def bound(**update: str) -> approvals.Binding:
    return JOB.model_copy(update=update)


def changed(**update: object) -> ApprovalDecision:
    return SIGNED.model_copy(update=update)


@pytest.mark.parametrize(
    ("decision", "job_id", "secret", "now", "why"),
    [
        (SIGNED, JOB, SECRET, NOW, None),
        (SIGNED, JOB, SECRET, NOW + timedelta(minutes=14, seconds=59), None),
        # As it arrives through a signal or an update: JSON and back.
        (ApprovalDecision.model_validate_json(SIGNED.model_dump_json()), JOB, SECRET, NOW, None),
        (DECISION, JOB, SECRET, NOW, "unsigned"),
        (changed(expires_at=None), JOB, SECRET, NOW, "unsigned"),
        (changed(signature=None), JOB, SECRET, NOW, "unsigned"),
        (changed(by="mallory"), JOB, SECRET, NOW, "bad signature"),
        (changed(approved=False), JOB, SECRET, NOW, "bad signature"),
        (changed(over_budget=True), JOB, SECRET, NOW, "bad signature"),
        (changed(reason="free video"), JOB, SECRET, NOW, "bad signature"),
        (changed(expires_at=NOW + timedelta(days=365)), JOB, SECRET, NOW, "bad signature"),
        (changed(signature="v2,AAAA"), JOB, SECRET, NOW, "bad signature"),
        (changed(signature="v2,ünïcode"), JOB, SECRET, NOW, "bad signature"),
        # Signed by a release that bound the job id only.
        (changed(signature="v1,AAAA"), JOB, SECRET, NOW, "old signature"),
        (SIGNED, bound(job_id="job-43"), SECRET, NOW, "bad signature"),
        # The same job id used again: another incarnation, another clip or provider.
        (SIGNED, bound(incarnation="0194-new-job"), SECRET, NOW, "bad signature"),
        (SIGNED, bound(cost_key="1080P/6s"), SECRET, NOW, "bad signature"),
        (SIGNED, bound(provider="kling"), SECRET, NOW, "bad signature"),
        # A rejection spends nothing: it binds the job incarnation only.
        (REJECTED, bound(provider="", cost_key=""), SECRET, NOW, None),
        (REJECTED, bound(incarnation="x"), SECRET, NOW, "bad signature"),
        (SIGNED, JOB, OTHER_SECRET, NOW, "bad signature"),
        (SIGNED, JOB, SECRET, NOW + timedelta(minutes=15), "expired at 2025-06-01 12:15:00 UTC"),
    ],
)
def test_a_signature_holds_only_for_its_job_its_decision_its_secret_and_its_time(
    decision: ApprovalDecision,
    job_id: approvals.Binding,
    secret: str,
    now: datetime,
    why: str | None,
):
    assert approvals.verify(secret, job_id, decision, now) == why


def test_no_two_decisions_share_a_canonical_form():
    expires = NOW + approvals.DEFAULT_VALIDITY
    one = ApprovalDecision(approved=True, by="a", reason="b,c")
    other = ApprovalDecision(approved=True, by="a,b", reason="c")
    assert approvals.canonical(JOB, one, expires) != approvals.canonical(JOB, other, expires)
    # A naive time is UTC: the same instant, the same bytes.
    naive = expires.replace(tzinfo=None)
    assert approvals.canonical(JOB, one, naive) == approvals.canonical(JOB, one, expires)
    assert SIGNED.expires_at == NOW + timedelta(minutes=15)
    assert SECRET not in SIGNED.model_dump_json()


# --- jobs whose workers hold the secret ----------------------------------------------------------

SIGNING = KEY | HOUR | {"SPILLWAY_APPROVAL_SECRET": SECRET}


def approver(jobs: Jobs, secret: str | None = SECRET) -> SpillwayClient:
    """An approver's machine: spillway.client with (or without) the secret in its settings."""
    settings = make_settings(SPILLWAY_APPROVAL_SECRET=secret)
    return SpillwayClient(jobs.client, settings=settings, task_queue=jobs.task_queue)


async def test_an_unsigned_approval_as_the_ui_sends_it_is_refused_recorded_and_spends_nothing(
    run_jobs: RunJobs,
):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **SIGNING) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        # The Temporal UI's "Send a Signal": a name and the JSON typed into it.
        await handle.signal(APPROVAL_SIGNAL, {"approved": True, "by": "ui-user"})
        waiting = await jobs.until(handle, lambda p: bool(p.ignored_signals))
        assert waiting.state == "awaiting_approval" and stubs.creates == 0
        plan: Plan = await handle.result()  # the window closes: local

    assert (plan.state, plan.route, plan.approval) == ("completed", "local", None)
    [ignored] = plan.ignored_signals
    assert (ignored.by, ignored.approved) == ("ui-user", True)
    assert "takes only signed decisions (this one: unsigned)" in ignored.why
    assert "SPILLWAY_APPROVAL_SECRET" in ignored.why
    assert stubs.creates == 0


async def test_a_signed_approval_from_the_client_spends_once_and_the_secret_stays_out_of_history(
    run_jobs: RunJobs,
):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **SIGNING) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        answer = await approver(jobs).approve(handle.id, "bär", "client deadline")
        plan: Plan = await handle.result()
        recorded = await handle.fetch_history()
    # What this run recorded (the patch marker, approval_verify) replays as the worker runs it.
    replayer = Replayer(workflows=WORKFLOWS, data_converter=pydantic_data_converter)
    await replayer.replay_workflow(recorded)
    history = history_text(recorded)
    assert APPROVAL_VERIFY in history and SIGNED_APPROVALS in history

    assert answer == "approved"
    assert (plan.state, plan.route) == ("completed", "cloud")
    assert plan.approval is not None and (plan.approval.by, plan.approval.signed) == ("bär", True)
    assert "signature" not in plan.approval.model_dump()  # the plan shows who, not the MAC
    assert plan.ignored_signals == []
    assert stubs.creates == 1
    assert '"by":"bär"' in history  # the decoded payloads are searched too
    assert '"signature":"v2,' in history  # the signature is there: it is no secret
    assert SECRET not in history


def by_changed(job: approvals.Binding) -> ApprovalDecision:
    signed = approvals.sign(SECRET, job, DECISION, datetime.now(UTC))
    return signed.model_copy(update={"by": "mallory"})


def for_another_job(job: approvals.Binding) -> ApprovalDecision:
    other = job.model_copy(update={"job_id": "another-job"})
    return approvals.sign(SECRET, other, DECISION, datetime.now(UTC))


def for_another_clip(job: approvals.Binding) -> ApprovalDecision:
    other = job.model_copy(update={"cost_key": "1080P/10s"})
    return approvals.sign(SECRET, other, DECISION, datetime.now(UTC))


def with_another_secret(job: approvals.Binding) -> ApprovalDecision:
    return approvals.sign(OTHER_SECRET, job, DECISION, datetime.now(UTC))


def expired(job: approvals.Binding) -> ApprovalDecision:
    signed_at = datetime.now(UTC) - approvals.DEFAULT_VALIDITY - timedelta(seconds=2)
    return approvals.sign(SECRET, job, DECISION, signed_at)


@pytest.mark.parametrize(
    ("make", "by", "named"),
    [
        (by_changed, "mallory", "this one: bad signature"),
        (for_another_job, "bär", "this one: bad signature"),
        (for_another_clip, "bär", "this one: bad signature"),
        (with_another_secret, "bär", "this one: bad signature"),
        (expired, "bär", "this one: expired at"),
    ],
)
async def test_a_tampered_misdirected_or_expired_decision_is_refused_and_the_job_waits_on(
    run_jobs: RunJobs, make: Callable[[approvals.Binding], ApprovalDecision], by: str, named: str
):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **SIGNING) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            binding = await client_jobs.binding(jobs.client, handle.id, approved=True)
            await handle.execute_update(DECIDE_UPDATE, make(binding), result_type=str)
        still = await jobs.until(handle, "awaiting_approval")
        # The person decides again, properly signed: the refusal spoilt nothing.
        await approver(jobs).reject(handle.id, "bär", "too expensive")
        plan: Plan = await handle.result()

    assert isinstance(refused.value.cause, ApplicationError)
    assert named in refused.value.cause.message
    [ignored] = still.ignored_signals
    assert (ignored.by, ignored.approved) == (by, True) and named in ignored.why
    assert still.approval is None and stubs.creates == 0
    assert (plan.state, plan.route) == ("completed", "local")
    assert plan.approval is not None and plan.approval.signed and not plan.approval.approved
    assert stubs.creates == 0


async def test_an_approver_without_the_secret_is_refused_with_what_to_do(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **SIGNING) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        with pytest.raises(Failed, match="this one: unsigned"):
            await approver(jobs, secret=None).approve(handle.id, "bär")
        await jobs.cancel(handle)
    assert stubs.creates == 0


async def test_workers_without_the_secret_take_a_signed_decision_as_any_other(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **KEY, **HOUR) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        assert await approver(jobs).approve(handle.id, "bär") == "approved"
        plan: Plan = await handle.result()
    assert (plan.route, plan.approval and plan.approval.signed) == ("cloud", False)
    assert stubs.creates == 1


# --- who can approve, as `health` says it ---------------------------------------------------------


@pytest.mark.parametrize(
    ("shell", "workers", "says"),
    [
        (False, None, OPEN_TO_NAMESPACE),
        (False, False, OPEN_TO_NAMESPACE),
        (True, False, "the workers do not check"),
        (True, None, "unknown: no worker answered"),
        (True, True, "only holders of SPILLWAY_APPROVAL_SECRET"),
        (False, True, "its approve|reject would be refused"),
    ],
)
def test_health_says_who_can_approve(shell: bool, workers: bool | None, says: str):
    text = who_can_approve(shell, workers)
    assert says in text
    assert ("Send a Signal" in text) == (workers is not True and not (shell and workers is None))


# --- a rogue answering the job's signature check: the spend ledger checks for itself -------------


@activity.defn(name=APPROVAL_VERIFY)
async def rogue_verify(req: ApprovalCheck) -> ApprovalVerdict:
    """Whoever can poll the job's task queue can answer its `approval_verify`: "signed"."""
    return ApprovalVerdict(acceptable=True, signed=True)


async def test_an_unsigned_approval_the_rogue_calls_signed_creates_nothing_a_signed_one_once(
    run_dev_jobs: RunJobs,
):
    stubs = RouteStubs(BUSY)
    async with run_dev_jobs(stubs, verify=rogue_verify, **SIGNING) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        await handle.signal(APPROVAL_SIGNAL, {"approved": True, "by": "ui-user"})
        refused = await jobs.until(handle, lambda p: bool(p.ignored_signals))
        creates_then = stubs.creates
        # The owner, properly signed: the ledger finds that decision in the history.
        answer = await approver(jobs).approve(handle.id, "bär", "client deadline")
        plan: Plan = await handle.result()

    [ignored] = refused.ignored_signals
    assert (ignored.by, ignored.approved) == ("ui-user", True)
    assert "is not signed for this job incarnation, minimax and clip 768P/6s (unsigned)" in (
        ignored.why
    )
    assert refused.state == "awaiting_approval" and refused.approval is None
    assert creates_then == 0
    assert answer == "approved" and (plan.route, stubs.creates) == ("cloud", 1)


async def test_a_signature_for_another_incarnation_the_rogue_calls_signed_creates_nothing(
    run_dev_jobs: RunJobs,
):
    stubs = RouteStubs(BUSY)
    async with run_dev_jobs(stubs, verify=rogue_verify, **SIGNING) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        binding = await client_jobs.binding(jobs.client, handle.id, approved=True)
        # Signed for this job id when it was another job (an earlier use of the id).
        earlier = binding.model_copy(update={"incarnation": "an-earlier-first-run-id"})
        replayed = approvals.sign(SECRET, earlier, DECISION, datetime.now(UTC))
        await handle.signal(APPROVAL_SIGNAL, replayed)
        refused = await jobs.until(handle, lambda p: bool(p.ignored_signals))
        await jobs.cancel(handle)

    [ignored] = refused.ignored_signals
    assert "is not signed for this job incarnation" in ignored.why
    assert "(bad signature)" in ignored.why
    assert refused.state == "awaiting_approval" and refused.approval is None
    assert stubs.creates == 0
