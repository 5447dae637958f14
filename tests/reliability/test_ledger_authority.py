"""Scenario 7: the spend ledger as the only authority over money (issue 23). A real worker process
on the session's dev server, creates counted at the MiniMax double, and what else can reach the
namespace: a raw client and a foreign worker of its own.

- a foreign workflow, even named VideoJobWorkflow, on another task queue, scheduling the create
  on spillway's queue with a copied request after a forged reservation: no create, no entry;
- forged ledger updates (budgets emptied, cost 0, over the budget, a settle of another job's
  entry): no budget and no entry changes;
- a terminated ledger: the next cloud job fails closed naming `spillway ledger restore`; restore
  brings the entries back; a reset job then follows its recorded task, creates stay 1;
- a job id used again after its execution was deleted is rendered anew, never the old video.

Each runs twice (`ledger_workers`): with the workers' workflow cache and without one, where every
workflow task of the jobs and the ledger replays its whole history.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio import workflow
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import (
    DeleteWorkflowExecutionRequest,
    ResetWorkflowExecutionRequest,
)
from temporalio.client import Client, WorkflowFailureError, WorkflowUpdateFailedError
from temporalio.common import RetryPolicy, WorkflowIDReusePolicy
from temporalio.service import RPCError, RPCStatusCode
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from activities.cloud.models import CloudCreate
from activities.spend.ledger import SpendLedger
from spillway.core import names
from spillway.core.ledger import LedgerInput, LedgerSummary
from spillway.core.ledger_seal import sealed
from spillway.core.models import CloudRequest
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.harness import cli
from tests.reliability.test_money import ledger
from tests.support.constants import BUSY_VRAM_PCT, CLIP_USD, LEDGER_SECRET
from tests.support.jobs import reset_to_first_workflow_task
from tests.support.waiting import until
from workflows.spend_ledger import SpendLedgerWorkflow
from workflows.video_job import VideoJobWorkflow

BUDGET = {"CLOUD_DAILY_BUDGET_USD": 0.01}  # less than one clip
VETTED = EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED  # the ledger vets each batch by an activity
TASK_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED


@workflow.defn(name=names.VIDEO_JOB)
class ForeignJob:
    """Someone else's workflow, named as spillway's, on its own task queue: it asks spillway's
    queue for a create, as a copied request of a real job would."""

    @workflow.run
    async def run(self, spillway_queue: str) -> str:
        create = CloudCreate(
            job_id=workflow.info().workflow_id,
            request=CloudRequest(prompt="a free video, please"),
            authorisation="approved",
        )
        done = await workflow.execute_activity(
            "minimax_create",
            create,
            task_queue=spillway_queue,
            start_to_close_timeout=timedelta(seconds=30),
            retry_policy=RetryPolicy(maximum_attempts=1),
        )
        return str(done)


async def busy_and_armed(workers: Any, comfyui: ComfyUISim, minimax: MiniMaxSim) -> Any:
    """A worker whose GPU is busy and whose cloud fallback is armed: jobs go to MiniMax."""
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    return await workers(
        COMFYUI_URL=comfyui.url, MINIMAX_BASE_URL=minimax.url, CLOUD_VIDEO_FALLBACK_ENABLED=1
    )


async def forged(client: Client, task_queue: str, update: str, arg: Any) -> str:
    """A raw client's update to the ledger; what the ledger answered (it must refuse)."""
    handle = client.get_workflow_handle(names.ledger_id(task_queue))
    with pytest.raises(WorkflowUpdateFailedError) as refused:
        await handle.execute_update(update, arg)
    return str(refused.value.cause)


async def replace_ledger(
    client: Client, task_queue: str, inp: LedgerInput, why: str, *, seal: bool = False
) -> str:
    """As someone who may start workflows: spillway's ledger terminated, another started on
    its queue with `inp` (`seal`: sealed with the workers' secret, as an operator's `spillway
    ledger restore` starts it); the new run's id."""
    ledger_id = names.ledger_id(task_queue)
    handle = client.get_workflow_handle(ledger_id)
    if seal:
        after = (await handle.describe()).run_id
        inp = sealed(LEDGER_SECRET, ledger_id, inp, datetime.now(UTC), after)
    await handle.terminate(reason=f"test: {why}")
    started = await client.start_workflow(
        SpendLedgerWorkflow.run,
        inp,
        id=ledger_id,
        task_queue=task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )
    return started.result_run_id or ""


async def ledger_started(client: Client, task_queue: str) -> None:
    """The worker's start asks the ledger to read the budgets."""

    async def summary() -> LedgerSummary | None:
        try:
            return await SpendLedger(client, task_queue).summary()
        except RPCError as err:
            # A query a starved server did not answer in time: asked again.
            if err.status not in (RPCStatusCode.CANCELLED, RPCStatusCode.DEADLINE_EXCEEDED):
                raise
            return None

    await until(summary, lambda s: s is not None, timeout_s=120)


async def test_a_foreign_workflow_named_like_spillways_job_cannot_spend(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    worker = await ledger_workers(COMFYUI_URL=comfyui.url, MINIMAX_BASE_URL=minimax.url, **BUDGET)
    client = jobs_on(worker).client
    await ledger_started(client, worker.task_queue)
    foreign_queue, foreign_id = f"foreign-{uuid.uuid4()}", f"foreign-{uuid.uuid4().hex[:8]}"
    foreign = Worker(
        client,
        task_queue=foreign_queue,
        workflows=[ForeignJob],
        workflow_runner=UnsandboxedWorkflowRunner(),  # its own code, in this test's module
    )
    async with foreign:
        handle = await client.start_workflow(
            ForeignJob.run, worker.task_queue, id=foreign_id, task_queue=foreign_queue
        )
        reservation = {
            "job_id": foreign_id,
            "run_id": handle.result_run_id,
            "provider": "minimax",
            "cost_usd": 0,
            "budgets": {"daily_usd": None, "monthly_usd": None},
            "authorised_by": "mallory",
            "authorisation": "approved",
        }
        why = await forged(client, worker.task_queue, names.LEDGER_RESERVE, reservation)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()

    assert f"runs on task queue {foreign_queue!r}" in why
    activity_failure = failed.value.cause
    assert activity_failure is not None and "nothing was sent" in str(activity_failure.__cause__)
    assert (minimax.create_calls, minimax.tasks_created) == (0, 0)
    summary = await ledger(client, worker.task_queue)
    assert summary.entries == [] and summary.day.budget_usd == 0.01


async def test_forged_ledger_updates_change_no_budget_and_no_entry(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    worker = await ledger_workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        CLOUD_DAILY_BUDGET_USD=0.3,  # one clip
        APPROVAL_TIMEOUT_S=600,
    )
    jobs = jobs_on(worker)
    paid = await jobs.submit("paid for")  # armed, within the budget: one create
    assert (await jobs.until(paid, "completed")).route == "cloud"
    waiting = await jobs.submit("waiting")  # the budget cannot cover a second clip
    await jobs.until(waiting, lambda p: "budget_exhausted" in p.reasons)
    queue = worker.task_queue
    before = await ledger(jobs.client, queue)
    run_of_paid = (await jobs.client.get_workflow_handle(paid).describe()).run_id

    emptied = {"budgets": {"daily_usd": None}, "by": "mallory"}  # unsigned: refused
    why_budget = await forged(jobs.client, queue, names.LEDGER_CONFIGURE, emptied)
    over = {
        "job_id": waiting,
        "run_id": (await jobs.client.get_workflow_handle(waiting).describe()).run_id,
        "provider": "minimax",
        "authorised_by": "mallory",
        "authorisation": "approved_over_budget",
    }
    why_over = await forged(jobs.client, queue, names.LEDGER_RESERVE, over)
    settle = {"job_id": paid, "run_id": run_of_paid, "state": "maybe_charged"}
    why_settle = await forged(jobs.client, queue, names.LEDGER_SETTLE, settle)
    begin = {"job_id": paid, "run_id": run_of_paid, "attempt": "mallory"}
    await forged(jobs.client, queue, names.LEDGER_BEGIN, begin)
    after = await ledger(jobs.client, queue)

    assert "not running" in why_over and "not running" in why_settle
    assert "not signed" in why_budget
    assert after.day.budget_usd == 0.3 and after.day.spent_usd == pytest.approx(CLIP_USD)
    paid_entries = [e for e in after.entries if e.job_id == paid]
    assert [e.state for e in paid_entries] == ["charged"]
    assert [e.model_dump() for e in after.entries if e.job_id == paid] == [
        e.model_dump() for e in before.entries if e.job_id == paid
    ]
    assert not [e for e in after.entries if e.authorised_by == "mallory"]
    assert (await jobs.status(waiting)).state == "awaiting_approval"
    assert minimax.create_calls == 1


async def test_forged_settles_with_a_negative_or_nan_cost_during_a_create_change_nothing(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    # The job's create is in flight while the forgeries arrive, however long they take.
    minimax.creates_held = asyncio.Event()
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    worker = await ledger_workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        MINIMAX_CREATE_TIMEOUT_S=60,  # the longest allowed: held until the forgeries are answered
    )
    jobs = jobs_on(worker)
    job = await jobs.submit("a slow create")
    await until(lambda: minimax.create_calls, lambda n: n == 1, what="the create in flight")
    run_id = (await jobs.client.get_workflow_handle(job).describe()).run_id
    refusals = []
    for cost in (-1e9, float("nan"), float("inf")):
        settle = {"job_id": job, "run_id": run_id, "state": "maybe_charged", "cost_usd": cost}
        refusals.append(await forged(jobs.client, worker.task_queue, names.LEDGER_SETTLE, settle))
    minimax.creates_held.set()
    plan = await jobs.until(job, "completed")
    summary = await ledger(jobs.client, worker.task_queue)

    # Refused as it arrives: the request does not decode (SettleRequest.cost_usd is finite, >= 0).
    assert all("Failed decoding arguments" in why for why in refusals), refusals
    assert plan.route == "cloud" and (minimax.create_calls, minimax.tasks_created) == (1, 1)
    assert summary.day.spent_usd == pytest.approx(CLIP_USD)
    assert summary.month.spent_usd == pytest.approx(CLIP_USD)
    assert [e.state for e in summary.entries] == ["charged"]


async def test_forged_frees_and_begins_during_a_create_change_nothing_and_the_create_goes_on(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    """While a job's create is in flight, someone who reads Temporal (the job's run, its pending
    create's activity id and attempt) asks the ledger to free the entry, to re-price it, and to
    begin it again, as that very attempt or as another: only the attempt holding the nonce it
    began with may, so each is refused and the real create settles as it would have."""
    minimax.creates_held = asyncio.Event()
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    worker = await ledger_workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        MINIMAX_CREATE_TIMEOUT_S=60,  # the longest allowed: held until the forgeries are answered
    )
    jobs = jobs_on(worker)
    job = await jobs.submit("a slow create")
    await until(lambda: minimax.create_calls, lambda n: n == 1, what="the create in flight")
    described = (await jobs.client.get_workflow_handle(job).describe()).raw_description
    run_id = described.workflow_execution_info.execution.run_id
    [create] = [p for p in described.pending_activities if p.activity_type.name == "minimax_create"]
    attempt = f"{run_id}/{create.activity_id}/{create.attempt}"
    queue, before = worker.task_queue, await ledger(jobs.client, worker.task_queue)
    forgeries = {
        "refused": (names.LEDGER_SETTLE, {"job_id": job, "run_id": run_id, "state": "refused"}),
        "released": (names.LEDGER_SETTLE, {"job_id": job, "run_id": run_id, "state": "released"}),
        "cheaper": (
            names.LEDGER_SETTLE,
            {"job_id": job, "run_id": run_id, "state": "maybe_charged", "cost_usd": 0},
        ),
        "nonce guessed": (
            names.LEDGER_SETTLE,
            {"job_id": job, "run_id": run_id, "state": "refused", "nonce": "0" * 64},
        ),
        "another attempt": (
            names.LEDGER_BEGIN,
            {"job_id": job, "run_id": run_id, "attempt": f"{run_id}/{create.activity_id}/9"},
        ),
        "its attempt": (
            names.LEDGER_BEGIN,
            {"job_id": job, "run_id": run_id, "attempt": attempt, "token": "f" * 64},
        ),
    }
    why = {name: await forged(jobs.client, queue, u, arg) for name, (u, arg) in forgeries.items()}
    minimax.creates_held.set()
    plan = await jobs.until(job, "completed")
    after = await ledger(jobs.client, queue)

    for name in ("refused", "released", "cheaper", "nonce guessed"):
        assert "only the create attempt that began may record" in why[name], why[name]
    assert "is not the create job" in why["another attempt"]
    # Refused whether or not the create began yet: its heartbeat shows another token, or, once
    # the create beats on past its begin ("creating"), no token at all.
    shown_another = "is not the one create attempt" in why["its attempt"]
    assert shown_another or "shows no token yet" in why["its attempt"], why["its attempt"]
    assert [(e.state, e.cost_usd) for e in before.entries] == [("reserved", CLIP_USD)]
    assert plan.route == "cloud" and (minimax.create_calls, minimax.tasks_created) == (1, 1)
    [entry] = after.entries
    assert (entry.state, entry.task_id, entry.cost_usd) == ("charged", plan.cloud.task_id, CLIP_USD)
    assert after.day.spent_usd == pytest.approx(CLIP_USD)
    assert after.month.spent_usd == pytest.approx(CLIP_USD)


@pytest.mark.slow
async def test_a_terminated_ledger_fails_closed_until_restored_then_a_reset_job_follows_its_task(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, sightings
):
    worker = await busy_and_armed(ledger_workers, comfyui, minimax)
    jobs = jobs_on(worker)
    first = await jobs.submit("before the operator's cleanup")
    done = await jobs.until(first, "completed")
    assert done.cloud is not None and minimax.create_calls == 1
    handle_of_ledger = jobs.client.get_workflow_handle(names.ledger_id(worker.task_queue))
    await handle_of_ledger.terminate(reason="test: an operator cleans up")

    second = await jobs.submit("after it")
    failed = await jobs.until(second, "failed")
    _, shown, _ = await cli(sightings, "budget", env=worker.env)
    code, out, err = await cli(sightings, "ledger", "restore", "--json", env=worker.env)
    restored_budget = await ledger(jobs.client, worker.task_queue)
    new_run = await reset_to_first_workflow_task(jobs.client, first)
    handle = jobs.client.get_workflow_handle_for(VideoJobWorkflow.run, first, run_id=new_run)
    again = await asyncio.wait_for(handle.result(), 60)

    assert "the spend ledger is closed (TERMINATED)" in shown
    assert failed.error is not None and "spillway ledger restore" in failed.error
    assert "nothing was sent" in failed.error
    assert code == 0, err
    assert '"entries": 1' in out and '"closed_as": "TERMINATED"' in out
    assert restored_budget.month.spent_usd == pytest.approx(CLIP_USD)
    [entry] = restored_budget.entries
    assert (entry.job_id, entry.state, entry.task_id) == (first, "charged", done.cloud.task_id)
    assert again.cloud is not None and again.cloud.task_id == done.cloud.task_id
    assert f"followed_recorded_task={done.cloud.task_id}" in again.reasons
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
    code, _, err = await cli(sightings, "ledger", "restore", env=worker.env)
    assert code == 1 and "is running: nothing to restore" in err


@pytest.mark.slow
async def test_a_job_id_used_again_after_its_execution_was_deleted_is_rendered_anew(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    worker = await busy_and_armed(ledger_workers, comfyui, minimax)
    jobs = jobs_on(worker)
    job_id = f"reused-{uuid.uuid4().hex[:8]}"
    await jobs.submit("last month's video", job_id=job_id)
    old = await jobs.until(job_id, "completed")
    await jobs.client.workflow_service.delete_workflow_execution(
        DeleteWorkflowExecutionRequest(
            namespace=jobs.client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=job_id),
        )
    )

    async def gone() -> bool:
        try:
            await jobs.client.get_workflow_handle(job_id).describe(rpc_timeout=timedelta(seconds=2))
        except RPCError as exc:
            return exc.status == RPCStatusCode.NOT_FOUND
        return False

    await until(gone, lambda g: g, timeout_s=60)
    await jobs.submit("this month's video", job_id=job_id)
    new = await jobs.until(job_id, "completed")

    assert old.cloud is not None and new.cloud is not None
    assert new.cloud.task_id != old.cloud.task_id
    assert not [r for r in new.reasons if r.startswith("followed_recorded_task")]
    assert (minimax.create_calls, minimax.tasks_created) == (2, 2)
    assert [b["prompt"] for b in minimax.create_bodies][-1] == "this month's video"


async def test_a_job_reset_after_the_ledger_continued_as_new_follows_its_task_from_history(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    """The continued ledger no longer holds the settled entry, only its incarnation's tag: the
    reset job finds the entry in the history of the run that settled it, and creates nothing."""
    worker = await busy_and_armed(ledger_workers, comfyui, minimax)
    jobs = jobs_on(worker)
    await ledger_started(jobs.client, worker.task_queue)
    # Reserve, begin, settle: then it continues as new.
    short = LedgerInput(updates_per_run=3)
    await replace_ledger(jobs.client, worker.task_queue, short, "a short-lived ledger", seal=True)
    job_id = await jobs.submit("made before the ledger continued")
    done = await jobs.until(job_id, "completed")
    assert done.cloud is not None
    held = await until(
        lambda: ledger(jobs.client, worker.task_queue),
        lambda s: not s.entries and s.month.spent_usd > 0,
    )

    new_run = await reset_to_first_workflow_task(jobs.client, job_id)
    handle = jobs.client.get_workflow_handle_for(VideoJobWorkflow.run, job_id, run_id=new_run)
    again = await asyncio.wait_for(handle.result(), 60)

    assert held.month.spent_usd == pytest.approx(CLIP_USD)
    assert again.cloud is not None and again.cloud.task_id == done.cloud.task_id
    assert f"followed_recorded_task={done.cloud.task_id}" in again.reasons
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)


async def test_a_ledger_reset_by_an_operator_takes_over_its_past_and_restore_follows_the_reset(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, sightings
):
    """Reset to just after its first reservation, the ledger's history holds less than it
    granted: it takes over what the run it was reset from held before it grants again
    (tests/reliability/test_ledger_reset.py: nothing twice). Terminated and restored, it gets
    back everything, following the reset back to the run it was made from."""
    worker = await busy_and_armed(ledger_workers, comfyui, minimax)
    jobs = jobs_on(worker)
    first = await jobs.submit("before the reset")
    done = await jobs.until(first, "completed")
    assert done.cloud is not None
    ledger_id = names.ledger_id(worker.task_queue)
    handle_of_ledger = jobs.client.get_workflow_handle(ledger_id)
    history = await handle_of_ledger.fetch_history()
    vetted = next(e.event_id for e in history.events if e.event_type == VETTED)
    after = next(
        e.event_id for e in history.events if e.event_type == TASK_COMPLETED and e.event_id > vetted
    )
    old_run = (await handle_of_ledger.describe()).run_id
    await jobs.client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=jobs.client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=ledger_id, run_id=old_run),
            reason="test: an operator resets the ledger",
            workflow_task_finish_event_id=after,
            request_id=str(uuid.uuid4()),
        )
    )

    second = await jobs.submit("after the reset")
    again = await jobs.until(second, "completed")
    assert again.cloud is not None and again.route == "cloud"
    assert (minimax.create_calls, minimax.tasks_created) == (2, 2)
    await jobs.client.get_workflow_handle(ledger_id).terminate(reason="test: it had been reset")
    code, _, err = await cli(sightings, "ledger", "restore", "--json", env=worker.env)
    restored = await ledger(jobs.client, worker.task_queue)

    assert code == 0, err
    held = {e.job_id: (e.state, e.task_id) for e in restored.entries}
    assert held == {
        first: ("charged", done.cloud.task_id),
        second: ("charged", again.cloud.task_id),
    }
