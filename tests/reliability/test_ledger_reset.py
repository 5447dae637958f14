"""The spend ledger grants nothing twice (issue 44). An operator's reset (Temporal UI: Reset)
makes a run that holds only what came before the reset point: before it grants anything it takes
back what the run it was reset from held (and what that run's continue-as-new successors held),
as `spillway ledger restore` would. An intruder's empty start over it grants nothing with the
workers as shipped. A real worker process on the session's dev server, a budget of one clip,
creates counted at the MiniMax double.
"""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy

from spillway.core import names
from spillway.core.ledger import Budgets, LedgerInput
from spillway.core.models import FINAL_STATES
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.test_ledger_authority import ledger_started, replace_ledger
from tests.reliability.test_money import ledger
from tests.support.constants import BUSY_VRAM_PCT, CLIP_USD
from tests.support.waiting import until
from workflows.spend_ledger import SpendLedgerWorkflow

ONE_CLIP = {"CLOUD_DAILY_BUDGET_USD": CLIP_USD}
VETTED = EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED  # the ledger vets each batch by an activity
TASK_COMPLETED = EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED


async def one_clip_worker(workers: Any, comfyui: ComfyUISim, minimax: MiniMaxSim) -> Any:
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    return await workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        **ONE_CLIP,
    )


async def reset_ledger(client: Client, task_queue: str, run_id: str, point: str) -> str:
    """The ledger's run `run_id` reset to its first workflow task, or to the task after its
    first vet ("after its first grant"); the new run's id."""
    ledger_id = names.ledger_id(task_queue)
    handle = client.get_workflow_handle(ledger_id, run_id=run_id)
    wanted = VETTED if point == "after its first grant" else TASK_COMPLETED
    # A run just made by a reset may not have completed a task of its own yet.
    history = await until(
        handle.fetch_history, lambda h: any(e.event_type == wanted for e in h.events)
    )
    after = (
        0
        if wanted == TASK_COMPLETED
        else next(e.event_id for e in history.events if e.event_type == VETTED)
    )
    task = next(
        e.event_id for e in history.events if e.event_type == TASK_COMPLETED and e.event_id > after
    )
    reset = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=ledger_id, run_id=run_id),
            reason=f"test: an operator resets the ledger to {point}",
            workflow_task_finish_event_id=task,
            request_id=str(uuid.uuid4()),
        )
    )
    assert reset.run_id != run_id
    return reset.run_id


async def current_run(client: Client, task_queue: str) -> str:
    described = await client.get_workflow_handle(names.ledger_id(task_queue)).describe()
    return described.run_id or ""


async def nothing_more_is_granted(jobs: Any, task_queue: str, minimax: MiniMaxSim) -> None:
    """The next armed job waits for the budget; the ledger shows the day's clip spent."""
    second = await jobs.submit("after the reset")
    plan = await jobs.until(second, lambda p: p.state in ("awaiting_approval", *FINAL_STATES))
    assert (plan.state, plan.error) == ("awaiting_approval", None)
    assert "budget_exhausted" in plan.reasons, plan.reasons
    summary = await ledger(jobs.client, task_queue)
    assert summary.day.spent_usd == pytest.approx(CLIP_USD)
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)


@pytest.mark.parametrize(
    ("point", "times"),
    [("first workflow task", 1), ("after its first grant", 1), ("first workflow task", 2)],
)
async def test_a_ledger_reset_holds_what_it_granted_and_grants_nothing_twice(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, point: str, times: int
):
    worker = await one_clip_worker(workers, comfyui, minimax)
    jobs = jobs_on(worker)
    first = await jobs.submit("the day's one clip")
    assert (await jobs.until(first, "completed")).route == "cloud"
    new_run = await current_run(jobs.client, worker.task_queue)

    for _ in range(times):  # twice: the reset run reset again, before it vetted anything
        new_run = await reset_ledger(jobs.client, worker.task_queue, new_run, point)

    await nothing_more_is_granted(jobs, worker.task_queue, minimax)
    assert await current_run(jobs.client, worker.task_queue) == new_run


async def test_a_ledger_reset_to_a_run_before_its_continue_as_new_grants_nothing_twice(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    """The run reset is one that continued as new: its successor granted the clip."""
    worker = await one_clip_worker(workers, comfyui, minimax)
    jobs = jobs_on(worker)
    await ledger_started(jobs.client, worker.task_queue)
    # Continuing as new after every update; the budget is the ledger's, so the replacing run
    # carries the one clip's, as a restore of the run it replaces would.
    short = LedgerInput(updates_per_run=1, budgets=Budgets(daily_usd=CLIP_USD))
    early = await replace_ledger(jobs.client, worker.task_queue, short, "continues", seal=True)
    first = await jobs.submit("the day's one clip")
    assert (await jobs.until(first, "completed")).route == "cloud"
    await until(lambda: current_run(jobs.client, worker.task_queue), lambda run: run != early)

    await reset_ledger(jobs.client, worker.task_queue, early, "first workflow task")

    await nothing_more_is_granted(jobs, worker.task_queue, minimax)


async def test_an_intruders_empty_start_over_the_ledger_grants_nothing_as_shipped(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    """Someone who may start workflows starts the ledger's workflow under its id with an empty
    input, terminating spillway's (what `TERMINATE_EXISTING` does in one call). The workers as
    shipped hold SPILLWAY_LEDGER_SECRET (they do not start with a key and without it): the
    intruder's run grants nothing, and the day's one clip stays the only create."""
    worker = await one_clip_worker(workers, comfyui, minimax)
    jobs = jobs_on(worker)
    first = await jobs.submit("the day's one clip")
    assert (await jobs.until(first, "completed")).route == "cloud"

    await jobs.client.start_workflow(
        SpendLedgerWorkflow.run,
        LedgerInput(),
        id=names.ledger_id(worker.task_queue),
        task_queue=worker.task_queue,
        id_conflict_policy=WorkflowIDConflictPolicy.TERMINATE_EXISTING,
    )

    second = await jobs.submit("after the intruder")
    refused = await jobs.until(second, "failed")
    assert refused.error is not None and "not started by spillway" in refused.error
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
