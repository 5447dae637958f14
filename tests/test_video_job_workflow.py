"""VideoJobWorkflow on the time-skipping server: every row of the decision table, approvals,
timeouts, headroom, unreachable ComfyUI, continue-as-new, and the money invariants counted on
what the workflow scheduled."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment

from activities.kling.activities import CREATE as KLING_CREATE
from activities.kling.activities import DOWNLOAD as KLING_DOWNLOAD
from activities.kling.activities import POLL as KLING_POLL
from activities.kling.activities import RECONCILE as KLING_RECONCILE
from activities.minimax.activities import CREATE as MINIMAX_CREATE
from activities.spend.ledger import SpendLedger
from spillway.core import names
from spillway.core.models import ApprovalDecision, LoadStatus, Plan
from spillway.core.names import APPROVAL_SIGNAL, DECIDE_UPDATE, run_tag
from tests.support.constants import CLIP_USD
from tests.support.jobs import RunJobs, cause_message
from tests.support.route_stubs import BUSY, DOWN, FREE, RouteStubs
from tests.support.settings import ARMED, KEY, KLING_ARMED, two_host_tiers
from tests.support.waiting import until
from workflows.admission import GPU_POOL
from workflows.job_state import IDS_PER_RUN
from workflows.timers import NEVER_CANCELLED
from workflows.video_job import VideoJobWorkflow

HOUR = {"APPROVAL_TIMEOUT_S": 3600, "APPROVAL_RECHECK_S": 60}


async def test_free_gpu_renders_locally(run_jobs: RunJobs):
    stubs = RouteStubs(FREE)
    async with run_jobs(stubs, **ARMED) as jobs:
        plan: Plan = await (await jobs.start()).result()
    assert (plan.state, plan.route, plan.overflow.trigger) == ("completed", "local", None)
    assert plan.outputs[0].path.endswith("v_00001_.mp4")
    assert stubs.calls[MINIMAX_CREATE] == 0 and stubs.calls[names.COMFYUI_SUBMIT] == 1


@pytest.mark.parametrize("load", [FREE, BUSY], ids=["local", "armed_cloud"])
async def test_a_run_records_only_the_patch_markers_of_changes_since_the_first_release(
    run_jobs: RunJobs, load: LoadStatus
):
    # Each marker is also a TemporalChangeVersion upsert: two history events and a visibility
    # write. 0.2.0 is the first release: a patch belongs to a change made after it, and only
    # where that change is met (the prompt id and the callback's id: ids per run).
    async with run_jobs(RouteStubs(load), **ARMED) as jobs:
        handle = await jobs.start()
        await handle.result()
        history = await handle.fetch_history()
    patches = [
        json.loads(e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data)
        for e in history.events
        if e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    expected = [GPU_POOL, NEVER_CANCELLED, IDS_PER_RUN] if load is FREE else [GPU_POOL]
    assert [p["id"] for p in patches] == expected


async def test_overloaded_armed_job_goes_to_the_cloud_once(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **ARMED) as jobs:
        plan: Plan = await (await jobs.start()).result()
    assert (plan.state, plan.route, plan.overflow.trigger) == ("completed", "cloud", "overloaded")
    assert plan.cloud is not None and plan.cloud.authorised_by == "armed"
    assert plan.cloud.task_id is not None and plan.cloud.estimated_cost_usd == CLIP_USD
    assert plan.overflow.last_signal is not None and plan.overflow.last_signal.overloaded
    assert stubs.calls[MINIMAX_CREATE] == 1 and stubs.calls[names.COMFYUI_SUBMIT] == 0


async def test_overloaded_unarmed_job_waits_and_approval_sends_it_to_the_cloud(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **KEY, **HOUR) as jobs:
        handle = await jobs.start()
        waiting = await jobs.until(handle, "awaiting_approval")
        assert waiting.reasons == BUSY.reasons
        assert stubs.calls[MINIMAX_CREATE] == 0
        await handle.signal(
            APPROVAL_SIGNAL,
            ApprovalDecision(approved=True, by="bär", reason="client deadline"),
        )
        plan: Plan = await handle.result()
    assert (plan.state, plan.route) == ("completed", "cloud")
    assert plan.approval is not None and (plan.approval.by, plan.approval.reason) == (
        "bär",
        "client deadline",
    )
    assert plan.cloud is not None and plan.cloud.authorised_by == "bär"
    assert stubs.calls[MINIMAX_CREATE] == 1


async def test_rejected_job_runs_locally_and_spends_nothing(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **ARMED | {"CLOUD_VIDEO_FALLBACK_ENABLED": False}, **HOUR) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        await handle.signal(APPROVAL_SIGNAL, ApprovalDecision(approved=False, by="bär"))
        plan: Plan = await handle.result()
    assert (plan.state, plan.route) == ("completed", "local")
    assert "rejected_by=bär" in plan.reasons and plan.approval and not plan.approval.approved
    assert stubs.calls[MINIMAX_CREATE] == 0


async def test_overloaded_unarmed_job_times_out_and_runs_locally(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **KEY, **HOUR) as jobs:
        plan: Plan = await (await jobs.start()).result()  # the hour passes instantly
    assert (plan.state, plan.route) == ("completed", "local")
    assert plan.reasons[-1] == "approval_timeout" and plan.approval is None
    assert plan.overflow.trigger == "overloaded"  # the load signal stays recorded
    assert stubs.calls[MINIMAX_CREATE] == 0
    # Re-probed every minute for an hour, then queued locally after all.
    assert 55 <= stubs.calls[names.PROBE] <= 62


async def test_headroom_returning_while_waiting_runs_the_job_locally_at_once(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY, BUSY, BUSY, FREE)
    async with run_jobs(stubs, **HOUR) as jobs:
        plan: Plan = await (await jobs.start()).result()
    assert (plan.route, plan.reasons[-1]) == ("local", "headroom_returned")
    assert stubs.calls[names.PROBE] == 4 and stubs.calls[MINIMAX_CREATE] == 0


async def test_a_single_dropped_probe_changes_nothing(run_jobs: RunJobs):
    stubs = RouteStubs(DOWN, FREE)
    async with run_jobs(stubs, **ARMED) as jobs:
        plan: Plan = await (await jobs.start()).result()
    assert (plan.route, plan.overflow.trigger) == ("local", None)
    assert stubs.calls[names.PROBE] == 2 and stubs.calls[MINIMAX_CREATE] == 0


async def test_confirmed_unreachable_comfyui_with_armed_fallback_goes_to_the_cloud(
    run_jobs: RunJobs,
):
    stubs = RouteStubs(DOWN, DOWN)
    async with run_jobs(stubs, **ARMED) as jobs:
        plan: Plan = await (await jobs.start()).result()
    assert (plan.route, plan.overflow.trigger) == ("cloud", "unreachable")
    assert plan.reasons == ["comfyui_unreachable"] and stubs.calls[MINIMAX_CREATE] == 1


async def test_unreachable_then_back_runs_locally_without_approval(run_jobs: RunJobs):
    stubs = RouteStubs(DOWN, DOWN, DOWN, DOWN, FREE)
    # The test polls its plan, and a time-skipping server does not skip time while a client
    # polls: a short confirmation delay keeps the wait for the second probe short.
    async with run_jobs(stubs, **HOUR, UNREACHABLE_CONFIRM_S=0.2) as jobs:
        handle = await jobs.start()
        waiting = await jobs.until(handle, "awaiting_approval")
        assert waiting.overflow.trigger == "unreachable"
        plan: Plan = await handle.result()
    assert (plan.state, plan.route) == ("completed", "local")
    assert stubs.calls[MINIMAX_CREATE] == 0


async def test_unreachable_after_the_approval_window_keeps_waiting_then_fails_clearly(
    run_jobs: RunJobs,
):
    stubs = RouteStubs(DOWN)
    # A re-probe every 10 minutes: 18 of them in 3 hours, not 180.
    hour = HOUR | {"APPROVAL_RECHECK_S": 600}
    async with run_jobs(stubs, UNREACHABLE_GIVE_UP_S=3 * 3600, **hour) as jobs:
        handle = await jobs.start()
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        plan: Plan = await handle.query(VideoJobWorkflow.plan)
    assert "ComfyUI did not answer for 3:00:00" in str(failed.value.cause)
    assert plan.state == "failed" and plan.error and "Resubmit" in plan.error
    assert stubs.calls[MINIMAX_CREATE] == 0 and stubs.calls[names.COMFYUI_SUBMIT] == 0


async def test_approval_without_a_key_fails_naming_the_key_and_calls_nothing(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **HOUR) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        await handle.signal(APPROVAL_SIGNAL, ApprovalDecision(approved=True, by="bär"))
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    assert "MINIMAX_API_KEY" in str(failed.value.cause)
    assert stubs.calls[MINIMAX_CREATE] == 0


async def test_duplicate_and_late_approvals_change_nothing_and_are_recorded(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    stubs.wait_release.clear()  # keep the local render running
    async with run_jobs(stubs, **KEY, **HOUR) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        await handle.signal(APPROVAL_SIGNAL, ApprovalDecision(approved=False, by="a"))
        await handle.signal(APPROVAL_SIGNAL, ApprovalDecision(approved=True, by="b"))
        await jobs.until(handle, "running_local")
        await handle.signal(APPROVAL_SIGNAL, ApprovalDecision(approved=True, by="c"))
        stubs.wait_release.set()
        plan: Plan = await handle.result()
    assert plan.route == "local" and plan.approval and plan.approval.by == "a"
    # b arrived after a's decision (in the same workflow task or a later one), c during the render.
    assert [s.by for s in plan.ignored_signals] == ["b", "c"]
    assert plan.ignored_signals[1].why == (
        f"job {plan.job_id} is not awaiting approval (state: running_local)"
    )
    assert stubs.calls[MINIMAX_CREATE] == 0


async def test_an_approve_update_for_a_job_that_is_not_waiting_is_refused(run_jobs: RunJobs):
    stubs = RouteStubs(FREE)
    stubs.wait_release.clear()
    async with run_jobs(stubs, **ARMED) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "running_local")
        with pytest.raises(WorkflowUpdateFailedError) as refused:
            await handle.execute_update(
                DECIDE_UPDATE, ApprovalDecision(approved=True, by="bär"), result_type=str
            )
        assert "is not awaiting approval (state: running_local)" in str(refused.value.cause)
        stubs.wait_release.set()
        plan: Plan = await handle.result()
    assert plan.ignored_signals == [] and stubs.calls[MINIMAX_CREATE] == 0


async def test_an_approve_update_while_waiting_is_accepted(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **KEY, **HOUR) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        answer = await handle.execute_update(
            DECIDE_UPDATE, ApprovalDecision(approved=True, by="bär"), result_type=str
        )
        plan: Plan = await handle.result()
    assert answer == "approved" and plan.route == "cloud"


async def test_continue_as_new_keeps_the_waiting_job_and_its_approval(
    run_jobs: RunJobs, env: WorkflowEnvironment
):
    stubs = RouteStubs(BUSY)
    async with run_jobs(stubs, **KEY, SPILLWAY_AWAIT_LOOPS_PER_RUN=2, **HOUR) as jobs:
        handle = await jobs.start()
        first = await jobs.until(handle, "awaiting_approval")
        current = jobs.client.get_workflow_handle(handle.id)
        for n in range(5):  # each signal the job ignores wakes it: several runs
            await current.signal(APPROVAL_SIGNAL, {"not": "a decision", "n": n})
            await env.sleep(1)
        latest = jobs.client.get_workflow_handle(handle.id, result_type=Plan)
        description = await latest.describe()
        assert description.run_id != handle.result_run_id
        plan = await jobs.until(latest, "awaiting_approval")
        assert plan.reasons == first.reasons and plan.overflow.trigger == "overloaded"
        await latest.signal(APPROVAL_SIGNAL, ApprovalDecision(approved=True, by="bär"))
        plan = await latest.result()
    assert plan.route == "cloud" and plan.approval and plan.approval.by == "bär"
    assert stubs.calls[MINIMAX_CREATE] == 1


async def test_waiting_job_posts_one_approval_notice(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    hook = {"APPROVAL_WEBHOOK_URL": "http://127.0.0.1:9/hook", "SPILLWAY_UI_URL": "http://ui:8233"}
    async with run_jobs(stubs, **hook, **HOUR) as jobs:
        handle = await jobs.start(job_id="notice-1")
        await handle.result()
    [notice] = stubs.notices
    assert notice.job_id == "notice-1" and notice.reasons == BUSY.reasons
    assert notice.approve_command == "spillway approve notice-1 --by NAME --reason TEXT"
    assert notice.ui_link == "http://ui:8233/namespaces/default/workflows/notice-1"
    assert notice.last_signal is not None and notice.last_signal.overloaded


async def test_a_failing_webhook_never_blocks_or_fails_the_job(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    stubs.fail[names.NOTIFY_APPROVAL] = ApplicationError("webhook answered 500")
    async with run_jobs(stubs, APPROVAL_WEBHOOK_URL="http://127.0.0.1:9/hook", **HOUR) as jobs:
        plan: Plan = await (await jobs.start()).result()
    assert (plan.state, plan.route) == ("completed", "local")
    assert stubs.calls[names.NOTIFY_APPROVAL] == 5  # retried, then given up


async def test_a_probe_that_fails_is_retried_and_never_leads_to_the_cloud(run_jobs: RunJobs):
    # The real probe never raises (fail-open); if its worker crashes, Temporal retries it.
    stubs = RouteStubs(FREE.model_copy(update={"errors": ["system_stats: HTTP 500"]}))
    stubs.probe_failures = 2
    async with run_jobs(stubs, **ARMED) as jobs:
        plan: Plan = await (await jobs.start()).result()
    assert plan.route == "local" and stubs.calls[MINIMAX_CREATE] == 0
    assert stubs.calls[names.PROBE] == 3


async def test_cancelling_a_waiting_job_ends_it_cancelled(run_dev_jobs: RunJobs):
    # On the dev server: the cancel may meet the budget read still running (see above).
    stubs = RouteStubs(BUSY)
    async with run_dev_jobs(stubs, **HOUR) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "awaiting_approval")
        plan = await jobs.cancel(handle)
    assert plan.state == "cancelled" and stubs.calls[names.COMFYUI_CANCEL] == 0


async def test_an_armed_job_cancelled_while_its_hosts_are_probed_ends_with_nothing_spent(
    run_dev_jobs: RunJobs, tmp_path: Path
):
    # Every host's probe fails to "no answer" on its own (fail-open); the cancel that stops
    # them must still end the job, not read as two unreachable hosts and a cloud create.
    nowhere = {"comfyui_url": "http://127.0.0.1:9"}  # the stubs probe, not ComfyUI
    tiers = two_host_tiers(tmp_path, {"name": "gpu-a"} | nowhere, nowhere)
    stubs = RouteStubs(DOWN)
    stubs.probe_gate.clear()
    async with run_dev_jobs(stubs, **ARMED, SPILLWAY_ROUTING_TIERS=tiers) as jobs:
        handle = await jobs.start()
        await until(lambda: stubs.calls[names.PROBE] == 2, what="both hosts probed")
        plan = await jobs.cancel(handle)
        stubs.probe_gate.set()
    assert plan.state == "cancelled" and plan.route is None
    assert stubs.calls[MINIMAX_CREATE] == 0 and stubs.creates == 0


async def test_cancelling_a_local_render_removes_the_prompt_from_comfyui(run_dev_jobs: RunJobs):
    # On the dev server: the time-skipping server keeps a cancelled job's running activity
    # pending, which holds its shared clock for every later test.
    stubs = RouteStubs(FREE)
    stubs.wait_release.clear()
    async with run_dev_jobs(stubs) as jobs:
        handle = await jobs.start()
        await jobs.until(handle, "running_local")
        plan = await jobs.cancel(handle)
    assert plan.state == "cancelled" and stubs.calls[names.COMFYUI_CANCEL] == 1
    assert "comfyui_prompt_running_cancelled" in plan.reasons


async def test_a_lost_prompt_is_resubmitted_once_with_a_new_attempt_id(run_jobs: RunJobs):
    stubs = RouteStubs(FREE)
    stubs.lost = 1
    async with run_jobs(stubs) as jobs:
        handle = await jobs.start(job_id="lost-1")
        plan: Plan = await handle.result()
    run = run_tag((await handle.describe()).run_id)  # prompt ids are unique per run
    assert plan.state == "completed" and plan.local_attempts == 2
    assert stubs.submitted == [f"spillway-lost-1-{run}-1", f"spillway-lost-1-{run}-2"]
    assert f"comfyui_lost_prompt=spillway-lost-1-{run}-1" in plan.reasons


async def test_a_prompt_lost_on_every_attempt_fails_after_the_limit(run_jobs: RunJobs):
    stubs = RouteStubs(FREE)
    stubs.lost = 10
    async with run_jobs(stubs, COMFYUI_MAX_ATTEMPTS=3) as jobs:
        with pytest.raises(WorkflowFailureError) as failed:
            await (await jobs.start()).result()
    assert "lost the prompt 3 times" in str(failed.value.cause)
    assert stubs.calls[names.COMFYUI_SUBMIT] == 3


async def test_a_rejected_graph_fails_the_job_with_comfyuis_reason_without_retry(
    run_jobs: RunJobs,
):
    stubs = RouteStubs(FREE)
    message = (
        "ComfyUI rejected the graph: node 2 (SaveAnimatedWEBP): Required input is missing: fps"
    )
    stubs.fail[names.COMFYUI_SUBMIT] = ApplicationError(
        message, type="ComfyUIGraphRejected", non_retryable=True
    )
    async with run_jobs(stubs) as jobs:
        handle = await jobs.start()
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        plan: Plan = await handle.query(VideoJobWorkflow.plan)
    assert cause_message(failed) == message and plan.error == message
    assert stubs.calls[names.COMFYUI_SUBMIT] == 1


async def test_a_create_whose_worker_vanished_fails_with_a_charge_may_exist(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    stubs.create_hang = True  # no heartbeat: like a worker killed during the call
    async with run_jobs(stubs, **ARMED, SPILLWAY_HEARTBEAT_TIMEOUT_S=2) as jobs:
        handle = await jobs.start()
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    assert "a charge may exist" in str(failed.value.cause)
    assert stubs.calls[MINIMAX_CREATE] == 1  # never retried


async def test_a_create_lost_before_it_began_is_sent_anew_and_renders_once(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    stubs.lost_before_begin = 1  # the server started it; the worker never got to the ledger
    async with run_jobs(stubs, **ARMED, SPILLWAY_HEARTBEAT_TIMEOUT_S=1) as jobs:
        plan: Plan = await (await jobs.start()).result()
    assert (plan.state, plan.route) == ("completed", "cloud")
    assert "create_lost_before_it_began=1" in plan.reasons
    assert (stubs.calls[MINIMAX_CREATE], stubs.creates) == (2, 1)  # one request left


async def test_creates_lost_before_they_began_three_times_fail_the_job_with_nothing_sent(
    run_jobs: RunJobs,
):
    stubs = RouteStubs(BUSY)
    stubs.lost_before_begin = 3
    async with run_jobs(stubs, **ARMED, SPILLWAY_HEARTBEAT_TIMEOUT_S=1) as jobs:
        with pytest.raises(WorkflowFailureError) as failed:
            await (await jobs.start()).result()
    assert "lost before the create began, 3 times in a row" in cause_message(failed)
    assert (stubs.calls[MINIMAX_CREATE], stubs.creates) == (3, 0)


async def test_a_kling_create_whose_worker_vanished_follows_the_task_kling_reports(
    run_jobs: RunJobs,
):
    stubs = RouteStubs(BUSY)
    stubs.create_hang = True  # no heartbeat: like a worker killed during the call
    stubs.reconciled = "task-kling-made"
    async with run_jobs(stubs, **KLING_ARMED) as jobs:
        plan: Plan = await (await jobs.start()).result()

    assert (plan.state, plan.route) == ("completed", "cloud")
    assert plan.cloud is not None and plan.cloud.task_id == "task-kling-made"
    assert "reconciled_lost_create=task-kling-made" in plan.reasons
    assert (stubs.calls[KLING_CREATE], stubs.calls[KLING_RECONCILE]) == (1, 1)
    assert stubs.calls[KLING_DOWNLOAD] == 1


async def test_a_kling_create_whose_worker_vanished_and_made_nothing_fails_saying_so(
    run_jobs: RunJobs,
):
    stubs = RouteStubs(BUSY)
    stubs.create_hang = True
    async with run_jobs(stubs, **KLING_ARMED) as jobs:
        with pytest.raises(WorkflowFailureError) as failed:
            await (await jobs.start()).result()

    message = cause_message(failed)
    assert "Kling had no task with external_task_id" in message
    assert "maybe_charged" in message and "will not create again" in message
    assert (stubs.calls[KLING_CREATE], stubs.calls[KLING_RECONCILE]) == (1, 1)
    assert stubs.calls[KLING_POLL] == 0


async def test_a_kling_job_cancelled_while_its_lost_create_is_reconciled_ends_cancelled(
    run_dev_jobs: RunJobs,
):
    # On the dev server: the time-skipping one cannot cancel a running activity.
    stubs = RouteStubs(BUSY)
    stubs.create_hang = True
    stubs.held.add(KLING_RECONCILE)
    async with run_dev_jobs(stubs, **KLING_ARMED) as jobs:
        handle = await jobs.start()
        await until(lambda: KLING_RECONCILE in stubs.holding, what="the reconcile running")
        plan = await jobs.cancel(handle)
        stubs.release.set()

    assert plan.state == "cancelled"
    assert plan.error is not None and "a charge may exist" in plan.error
    assert (stubs.calls[KLING_CREATE], stubs.calls[KLING_POLL]) == (1, 0)


async def test_a_permanent_minimax_error_fails_once_with_its_message(run_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    message = "MiniMax balance is empty (code 1008): top up, then resubmit the job"
    stubs.fail[MINIMAX_CREATE] = ApplicationError(
        message, type="MiniMaxPermanent", non_retryable=True
    )
    async with run_jobs(stubs, **ARMED) as jobs:
        with pytest.raises(WorkflowFailureError) as failed:
            await (await jobs.start()).result()
    # MiniMax is the only provider with a key here: no other to hand the job to.
    assert cause_message(failed).startswith("every cloud provider refused")
    assert f"MiniMax: {message}" in cause_message(failed)
    assert stubs.calls[MINIMAX_CREATE] == 1


async def test_a_host_silent_under_an_armed_job_sends_it_to_the_cloud_once(run_jobs: RunJobs):
    stubs = RouteStubs(FREE)
    stubs.silent = 1
    async with run_jobs(stubs, **ARMED) as jobs:
        plan: Plan = await (await jobs.start()).result()
    assert (plan.state, plan.route, plan.overflow.trigger) == ("completed", "cloud", "unreachable")
    assert any(r.startswith("comfyui_unreachable_since=") for r in plan.reasons)
    assert plan.reasons[-1] != "comfyui_answers_again" and any(
        "host_lost=" in r for r in plan.reasons
    )
    assert stubs.calls[names.COMFYUI_SUBMIT] == 1 and stubs.calls[MINIMAX_CREATE] == 1


async def test_a_host_silent_under_an_unarmed_job_fails_it_after_the_give_up(run_jobs: RunJobs):
    stubs = RouteStubs(FREE)
    stubs.silent = 1
    async with run_jobs(stubs, UNREACHABLE_GIVE_UP_S=90) as jobs:
        with pytest.raises(WorkflowFailureError) as failed:
            await (await jobs.start()).result()
    message = cause_message(failed)
    assert "GPU host" in message and "ComfyUI" in message and "not armed" in message
    assert stubs.calls[MINIMAX_CREATE] == 0


async def test_a_refusal_whose_settle_was_lost_is_settled_by_the_job_and_the_next_provider_runs(
    run_jobs: RunJobs,
):
    """MiniMax provably made nothing, but its create's record of that never reached the ledger:
    the job records `refused` itself, so Kling's reservation is not taken for a second create."""
    stubs = RouteStubs(BUSY)
    stubs.refused_unsettled = 1
    both = KLING_ARMED | {"CLOUD_PROVIDERS": "minimax,kling"}
    async with run_jobs(stubs, **both) as jobs:
        plan: Plan = await (await jobs.start()).result()
        summary = await SpendLedger(jobs.client, jobs.task_queue).summary()

    assert (plan.state, plan.route) == ("completed", "cloud")
    assert plan.cloud is not None and plan.cloud.provider == "kling"
    assert [a.provider for a in plan.cloud.attempts] == ["minimax"]
    assert summary is not None
    assert [(e.provider, e.state) for e in summary.entries] == [
        ("minimax", "refused"),
        ("kling", "charged"),
    ]
    assert stubs.creates == 2
