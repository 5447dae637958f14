"""Scenario 6: money across everything an operator or a deploy can do to a job (issue 10). Real
worker processes on the session's dev server, creates counted at the MiniMax double:

- 300 armed jobs racing for a budget of 10 clips: exactly 10 creates, 290 wait (budget_exhausted);
- a completed cloud job reset to its first workflow task (armed, and approved: the old approval
  signal is re-applied by the reset): no second create, the new run follows the recorded task;
- a job cancelled while its (slow) create is in flight: one create, its task id in the plan;
- the fallback disarmed and the worker restarted between the decision and the create: none;
- a job decided by a simulated worker that reaches a real one: the real key sends nothing.

All but the 300 jobs run twice (`ledger_workers`): with the workers' workflow cache and without
one, where every workflow task of the jobs and the ledger replays its whole history.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Any

import pytest
from temporalio.client import Client

from activities.spend.ledger import SpendLedger
from spillway.core import search_attributes as sa
from spillway.core.ledger import LedgerSummary
from spillway.core.models import ApprovalDecision
from spillway.core.names import APPROVAL_SIGNAL
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import SIM_API_KEY, MiniMaxSim
from tests.reliability.harness import assert_spend_covers, probes
from tests.support.constants import BUSY_VRAM_PCT, CLIP_USD
from tests.support.jobs import reset_to_first_workflow_task, start_all
from tests.support.waiting import until, until_all
from workflows.video_job import VideoJobWorkflow


async def ledger(client: Client, task_queue: str) -> LedgerSummary:
    summary = await SpendLedger(client, task_queue).summary()
    assert summary is not None
    return summary


async def count(client: Client, task_queue: str, state: str) -> int:
    query = f"TaskQueue = '{task_queue}' AND {sa.STATE.name} = '{state}'"
    return (await client.count_workflows(query)).count


@pytest.mark.slow
@pytest.mark.timeout(1800)  # a backstop: `until_all` fails when the jobs stop settling
async def test_300_armed_jobs_racing_for_a_budget_of_10_clips_make_exactly_10_creates(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    worker = await workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        CLOUD_DAILY_BUDGET_USD=10 * CLIP_USD,
        APPROVAL_TIMEOUT_S=3600,
        APPROVAL_RECHECK_S=3600,  # 290 waiting jobs re-probing every second would be the test
        # 300 jobs on two cores: production's margins, so a slow moment is not a lost worker.
        SPILLWAY_HEARTBEAT_TIMEOUT_S=30,
        MINIMAX_CREATE_TIMEOUT_S=30,
    )
    jobs = jobs_on(worker)
    ids = await start_all(partial(jobs.submit, f"race {n}") for n in range(300))

    async def settled() -> tuple[int, int]:
        return (
            await count(jobs.client, worker.task_queue, "completed"),
            await count(jobs.client, worker.task_queue, "awaiting_approval"),
        )

    async def settled_count() -> int:
        return sum(await settled())

    await until_all(settled_count, 300, what="the jobs settling")
    assert await settled() == (10, 290)
    assert (minimax.create_calls, minimax.tasks_created) == (10, 10)
    summary = await ledger(jobs.client, worker.task_queue)
    assert summary.day.spent_usd == pytest.approx(10 * CLIP_USD)
    assert summary.day.reserved_usd == 0
    assert summary.day.remaining_usd == pytest.approx(0)
    charged = [e for e in summary.entries if e.state == "charged"]
    # A reservation whose create never began (its worker lost under 300 jobs on two cores; the
    # job reserves again) is released unsent: an entry more, nothing sent, nothing spent.
    others = [e for e in summary.entries if e.state != "charged"]
    entries = "\n".join(e.model_dump_json() for e in summary.entries)
    assert len(charged) == 10, entries
    assert all(e.state == "released" and e.sent_at is None for e in others), entries
    assert {e.task_id for e in charged} == set(minimax.tasks)
    plans = await asyncio.gather(*map(jobs.status, ids))
    assert_spend_covers(summary, minimax, plans)
    waiting = [p for p in plans if p.route is None]
    assert len(waiting) == 290
    for plan in waiting:
        assert "budget_exhausted" in plan.reasons and plan.budget is not None
        assert (plan.budget.exhausted, plan.budget.estimate_usd) == ("day", CLIP_USD)


@pytest.mark.parametrize("authorised", ["armed", "approved"])
async def test_a_completed_cloud_job_reset_to_its_first_workflow_task_creates_nothing_more(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, authorised: str
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    worker = await ledger_workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=int(authorised == "armed"),
        APPROVAL_TIMEOUT_S=600,
    )
    jobs = jobs_on(worker)
    job_id = await jobs.submit(f"reset me ({authorised})")
    if authorised == "approved":
        await jobs.until(job_id, "awaiting_approval")
        decision = ApprovalDecision(approved=True, by="owner", reason="deadline")
        await jobs.client.get_workflow_handle(job_id).signal(APPROVAL_SIGNAL, decision)
    first = await jobs.until(job_id, "completed")
    assert first.cloud is not None and minimax.create_calls == 1

    new_run = await reset_to_first_workflow_task(jobs.client, job_id)
    handle = jobs.client.get_workflow_handle_for(VideoJobWorkflow.run, job_id, run_id=new_run)
    again = await asyncio.wait_for(handle.result(), 60)

    assert (again.state, again.route) == ("completed", "cloud")
    assert again.cloud is not None and again.cloud.task_id == first.cloud.task_id
    assert f"followed_recorded_task={first.cloud.task_id}" in again.reasons
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
    summary = await ledger(jobs.client, worker.task_queue)
    assert_spend_covers(summary, minimax, [again])
    [entry] = summary.entries
    assert (entry.state, entry.task_id) == ("charged", first.cloud.task_id)


async def test_a_job_cancelled_during_a_slow_create_records_the_task_it_ordered(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    minimax.create_delay_s = 3  # MiniMax takes its time; the task exists once it answers
    worker = await ledger_workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        MINIMAX_CREATE_TIMEOUT_S=10,
    )
    jobs = jobs_on(worker)
    job_id = await jobs.submit("cancel me mid-create")
    await until(lambda: minimax.create_bodies, timeout_s=30)
    await jobs.client.get_workflow_handle(job_id).cancel()

    plan = await jobs.until(job_id, "cancelled", timeout_s=30)
    [task_id] = minimax.tasks
    assert plan.cloud is not None and plan.cloud.task_id == task_id
    assert f"cancelled_after_create={task_id}" in plan.reasons
    assert plan.error is not None and f"ordered task {task_id}" in plan.error
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
    summary = await ledger(jobs.client, worker.task_queue)
    assert_spend_covers(summary, minimax, [plan])
    [entry] = summary.entries
    assert (entry.state, entry.task_id) == ("charged", task_id)


async def test_a_worker_disarmed_and_restarted_before_the_create_sends_nothing(
    ledger_workers, jobs_on, minimax: MiniMaxSim, refused_url: str
):
    # ComfyUI unreachable: the job reads an ARMED policy, probes, and sleeps before the second
    # probe; the worker is disarmed and restarted in that sleep.
    armed = await ledger_workers(
        COMFYUI_URL=refused_url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        UNREACHABLE_CONFIRM_S=4,
        APPROVAL_TIMEOUT_S=600,
    )
    jobs = jobs_on(armed)
    job_id = await jobs.submit("disarmed in time")
    await probes(jobs.client, job_id, at_least=1)
    await armed.kill()
    armed.env["CLOUD_VIDEO_FALLBACK_ENABLED"] = "0"
    await armed.start()

    plan = await jobs.until(job_id, "awaiting_approval", timeout_s=60)
    assert "fallback_disarmed" in plan.reasons
    assert plan.overflow.trigger == "unreachable"
    assert minimax.create_calls == 0


async def test_a_simulated_job_that_reaches_a_real_worker_sends_nothing_with_the_real_key(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    # `spillway dev --simulate` and a real worker pointed at one server and one task queue (the
    # mistake the separate `-sim` queue prevents): the simulated job waits for approval, then
    # only the real worker is left to run it.
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    async with MiniMaxSim(api_key=SIM_API_KEY) as simulator:
        simulated = await ledger_workers(
            COMFYUI_URL=comfyui.url,
            MINIMAX_BASE_URL=simulator.url,
            MINIMAX_API_KEY=SIM_API_KEY,
            SPILLWAY_SIMULATED=1,
            APPROVAL_TIMEOUT_S=600,
        )
        jobs = jobs_on(simulated)
        job_id = await jobs.submit("decided in the simulator")
        await jobs.until(job_id, "awaiting_approval")
        await simulated.kill()
        real: dict[str, Any] = {"MINIMAX_BASE_URL": minimax.url, "COMFYUI_URL": comfyui.url}
        await ledger_workers(SPILLWAY_TASK_QUEUE=simulated.task_queue, **real)
        decision = ApprovalDecision(approved=True, by="owner")
        await jobs.client.get_workflow_handle(job_id).signal(APPROVAL_SIGNAL, decision)
        plan = await jobs.until(job_id, "failed")
        assert simulator.create_calls == 0
    assert plan.error is not None and "simulated" in plan.error and "nothing was sent" in plan.error
    assert minimax.create_calls == 0
