"""A person's decision and the budget, with the route stubs: what an approval does once the
window has closed, when it races a place in the GPU line, when it cannot be read, when the budget
cannot cover it; armed jobs the budget cannot cover; and a start that tries to skip all of it."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta

import pytest
from temporalio.client import (
    WorkflowFailureError,
    WorkflowUpdateFailedError,
    WorkflowUpdateStage,
)
from temporalio.exceptions import ApplicationError

from activities.minimax.activities import CREATE as MINIMAX_CREATE
from spillway.core import names
from spillway.core.models import ApprovalDecision, AwaitCarry, CloudRequest, Plan, Policy, VideoJob
from spillway.core.names import APPROVAL_SIGNAL, DECIDE_UPDATE
from tests.support.constants import CLIP_USD
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import RunJobs, cause_message, pool_settled
from tests.support.route_stubs import BUSY, FREE, SEED, RouteStubs
from tests.support.settings import ARMED, KEY
from tests.support.waiting import until
from tests.test_video_job_workflow import HOUR
from workflows.texts import current_details


async def test_an_approval_arriving_with_the_deadline_is_refused_and_recorded(
    run_dev_jobs: RunJobs,
):
    stubs, queue = RouteStubs(BUSY), f"late-{uuid.uuid4()}"
    window = {"APPROVAL_TIMEOUT_S": 2, "APPROVAL_RECHECK_S": 3600}
    async with run_dev_jobs(stubs, task_queue=queue, **KEY, **window) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
    await asyncio.sleep(3)  # no worker: the deadline's timer fires unseen
    await handle.signal(APPROVAL_SIGNAL, ApprovalDecision(approved=True, by="late"))
    async with run_dev_jobs(stubs, task_queue=queue, **KEY, **window):
        plan: Plan = await handle.result()  # timer and signal reach the job in one activation

    assert (plan.state, plan.route) == ("completed", "local")
    assert "approval_timeout" in plan.reasons and plan.approval is None
    [ignored] = plan.ignored_signals
    assert ignored.by == "late" and "approval window closed" in ignored.why
    assert stubs.creates == 0


async def test_an_approval_taken_before_a_place_frees_wins_and_the_place_goes_back(
    run_dev_jobs: RunJobs,
):
    stubs = RouteStubs(BUSY)
    async with run_dev_jobs(
        stubs, **KEY, APPROVAL_TIMEOUT_S=600, SPILLWAY_POOL_REPROBE_S=1
    ) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        stubs.probe_gate.clear()
        probed = stubs.calls[names.PROBE]
        await until(lambda: stubs.calls[names.PROBE] > probed)  # the pool's re-probe is under way
        update = await handle.start_update(
            DECIDE_UPDATE,
            ApprovalDecision(approved=True, by="bär"),
            wait_for_stage=WorkflowUpdateStage.ACCEPTED,
            result_type=str,
        )
        stubs.loads = [FREE]  # the host has headroom again: the pool hands the job a place
        stubs.probe_gate.set()
        answer = await update.result()
        plan: Plan = await handle.result()
        view = await pool_settled(jobs.client, jobs.task_queue)

    # The approval came first: the job went to the cloud and gave the place it was handed back.
    assert answer.startswith("approved")
    assert (plan.state, plan.route) == ("completed", "cloud") and stubs.creates == 1
    assert "headroom_returned" not in plan.reasons
    assert stubs.calls[names.COMFYUI_SUBMIT] == 0
    assert view.line == [] and all(not h.places for h in view.hosts)


async def test_signals_that_cannot_be_read_are_recorded_not_dropped(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **KEY, **HOUR) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        await handle.signal(APPROVAL_SIGNAL, {"approved": True})  # the UI, "by" forgotten
        await handle.signal(APPROVAL_SIGNAL, "yes")
        await handle.signal(APPROVAL_SIGNAL)
        await handle.signal(APPROVAL_SIGNAL, ApprovalDecision(approved=False, by="bär"))
        plan: Plan = await handle.result()

    assert (plan.state, plan.route) == ("completed", "local")
    whys = [i.why for i in plan.ignored_signals]
    assert len(whys) == 3 and all(i.by is None for i in plan.ignored_signals)
    assert "by: Field required" in whys[0] and '{"approved":true}' in str(
        plan.ignored_signals[0].raw
    ).replace(" ", "")
    assert "not a decision" in whys[1] and "carried no input" in whys[2]
    assert stubs.creates == 0


async def test_a_hand_made_carry_on_a_fresh_start_fails_without_a_probe_or_a_create(
    run_jobs: RunJobs,
):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **ARMED) as jobs:
        job_id = f"carry-{uuid.uuid4().hex[:8]}"
        now = BUSY.measured_at
        policy = Policy(
            fallback_enabled=True,
            key_present=True,
            thresholds=SEED,
            approval_timeout_s=60,
            approval_recheck_s=60,
            unreachable_confirm_s=5,
            unreachable_give_up_s=600,
            comfyui_max_attempts=3,
            webhook_configured=False,
            ui_url="http://ui",
            await_loops_per_run=10,
            heartbeat_timeout_s=30,
            simulated=False,
            hosts=[],
            providers=["minimax"],
            job_webhook_configured=False,
        )
        carry = AwaitCarry(
            plan=Plan(job_id=job_id, state="awaiting_approval"),
            policy=policy,
            approval_deadline=now + timedelta(hours=1),
            give_up_at=now + timedelta(hours=1),
            pending_approval=ApprovalDecision(approved=True, by="nobody"),
        )
        job = VideoJob(
            job_id=job_id, graph=VIDEO_GRAPH, cloud=CloudRequest(prompt="free video?"), carry=carry
        )
        handle = await jobs.client.start_workflow(
            "VideoJobWorkflow", job, id=job_id, task_queue=jobs.task_queue
        )
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()

    assert "set by continue-as-new only" in cause_message(failed)
    assert stubs.calls[names.PROBE] == 0 and stubs.creates == 0


# --- the budget -------------------------------------------------------------------------------


async def test_an_armed_job_the_budget_cannot_cover_waits_saying_so(run_dev_jobs: RunJobs):
    # On the dev server: the cancel may meet the budget read still running, and the
    # time-skipping server answers ACTIVITY_UNKNOWN to cancelling a running activity.
    stubs = RouteStubs(BUSY)
    async with run_dev_jobs(stubs, **ARMED, **HOUR, CLOUD_DAILY_BUDGET_USD=0.1) as jobs:
        handle = await jobs.start()
        plan = await jobs.until(
            handle, lambda p: p.state == "awaiting_approval" and p.budget is not None
        )
        await jobs.cancel(handle)

    assert "budget_exhausted" in plan.reasons and plan.budget is not None
    assert (plan.budget.exhausted, plan.budget.estimate_usd) == ("day", CLIP_USD)
    assert plan.budget.day_remaining_usd == pytest.approx(0.1)
    assert stubs.creates == 0 and stubs.calls[MINIMAX_CREATE] == 0
    details = current_details(plan)  # what the UI shows
    assert "budget cannot cover" in details and "$0.10 left today" in details
    assert "budget_exhausted: the daily budget" in details
    # Its decision no longer reads "cloud ... armed": the ledger's refusal is its why.
    assert plan.quote is not None and plan.quote.route == "await_approval"
    assert plan.quote.why.startswith("budget_exhausted (day): the daily cloud budget ($0.10)")
    assert f"spillway approve {plan.job_id} --by NAME --over-budget" in details


@pytest.mark.parametrize("read", [names.SPEND_RECORDED, names.SPEND_VIEW])
async def test_a_job_cancelled_while_the_ledger_is_read_for_its_person_ends_cancelled(
    run_dev_jobs: RunJobs, read: str
):
    # Both reads outlive a ledger that fails (they only inform the person); a cancel that
    # reaches the job while one runs is no such failure and must end the job.
    stubs = RouteStubs(BUSY)
    stubs.held.add(read)
    async with run_dev_jobs(stubs, **KEY, **HOUR) as jobs:
        handle = await jobs.start()
        await until(lambda: read in stubs.holding, what=f"{read} running")
        plan = await jobs.cancel(handle)
        stubs.release.set()

    assert plan.state == "cancelled" and plan.route is None
    assert stubs.creates == 0 and stubs.calls[MINIMAX_CREATE] == 0


async def test_a_plain_approval_beyond_the_budget_is_refused_and_over_budget_goes_past_it(
    run_jobs: RunJobs,
):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **KEY, **HOUR, CLOUD_DAILY_BUDGET_USD=0.1) as jobs:
        handle = await jobs.start()
        waiting = await jobs.until(handle, "awaiting_approval")
        assert waiting.budget is not None and waiting.budget.estimate_usd == CLIP_USD
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(
                DECIDE_UPDATE, ApprovalDecision(approved=True, by="bär"), result_type=str
            )
        still = await jobs.until(handle, "awaiting_approval")
        answer = await handle.execute_update(
            DECIDE_UPDATE,
            ApprovalDecision(approved=True, by="bär", reason="client", over_budget=True),
            result_type=str,
        )
        plan: Plan = await handle.result()

    assert isinstance(refused.value.cause, ApplicationError)
    message = refused.value.cause.message
    assert "$0.10 left" in message and f"${CLIP_USD}" in message and "--over-budget" in message
    assert still.approval is None and [i.by for i in still.ignored_signals] == ["bär"]
    assert answer == "approved"
    assert (plan.state, plan.route) == ("completed", "cloud")
    assert plan.cloud is not None and plan.cloud.authorisation == "approved_over_budget"
    assert plan.approval is not None and plan.approval.over_budget
    assert stubs.creates == 1


async def test_an_approval_signal_beyond_the_budget_keeps_the_job_waiting(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **KEY, **HOUR, CLOUD_MONTHLY_BUDGET_USD=0) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        await handle.signal(APPROVAL_SIGNAL, ApprovalDecision(approved=True, by="bär"))
        plan: Plan = await handle.result()  # the window closes: local, nothing spent

    assert (plan.state, plan.route) == ("completed", "local")
    [ignored] = plan.ignored_signals
    assert "monthly cloud budget" in ignored.why and "--over-budget" in ignored.why
    assert plan.budget is not None and plan.budget.exhausted == "month"
    assert stubs.creates == 0
