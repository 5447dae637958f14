"""What the spend ledger no longer carries (issue 35, item 4): a created job's tag is carried for
40 days, while the namespace may keep the job, and let an operator reset it, for longer. A reset
run is refused a second create however long ago the first went out: the ledger's vet reads the
earlier runs of the job's incarnation for a create or a followed task. Creates counted at the
MiniMax double, the worker a real process on the session's dev server, with and without its
workflow cache (`ledger_workers`).
"""

from __future__ import annotations

import asyncio

from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import DeleteWorkflowExecutionRequest
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError, RPCStatusCode

from spillway.core.ledger import LedgerInput
from spillway.core.models import Plan
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.test_ledger_authority import (
    busy_and_armed,
    ledger_started,
    replace_ledger,
)
from tests.reliability.test_money import ledger
from tests.support.jobs import reset_to_first_workflow_task
from tests.support.waiting import until


async def test_a_job_reset_after_the_ledger_forgot_its_create_is_granted_none(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    worker = await busy_and_armed(ledger_workers, comfyui, minimax)
    jobs = jobs_on(worker)
    job_id = await jobs.submit("made long ago")
    done = await jobs.until(job_id, "completed")
    assert done.cloud is not None
    # As after the tag's 40 days: a ledger that holds neither the entry nor the tag.
    forgot = LedgerInput()
    await replace_ledger(jobs.client, worker.task_queue, forgot, "a forgetful ledger", seal=True)
    await ledger_started(jobs.client, worker.task_queue)

    first_run = (await jobs.client.get_workflow_handle(job_id).describe()).run_id
    await reset_and_see_it_refused(jobs.client, job_id, done.cloud.task_id)
    # The run that created is gone (the namespace's retention): the reset run's own history,
    # which followed the task or recorded the refusal, refuses the next reset.
    await jobs.client.workflow_service.delete_workflow_execution(
        DeleteWorkflowExecutionRequest(
            namespace=jobs.client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=job_id, run_id=first_run),
        )
    )
    await until(lambda: gone(jobs.client, job_id, first_run), bool, timeout_s=60)
    await reset_and_see_it_refused(jobs.client, job_id, done.cloud.task_id)

    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
    held = await ledger(jobs.client, worker.task_queue)
    assert not held.entries and held.month.spent_usd == 0


async def reset_and_see_it_refused(client: Client, job_id: str, task_id: str) -> None:
    new_run = await reset_to_first_workflow_task(client, job_id)
    handle = client.get_workflow_handle(job_id, run_id=new_run, result_type=Plan)
    try:  # it follows the task the terminated ledger's history records, or fails saying why
        again = await asyncio.wait_for(handle.result(), 90)
        assert again.cloud is not None and again.cloud.task_id == task_id
    except WorkflowFailureError as failed:
        assert "ordered or followed a cloud task" in str(failed.cause)


async def gone(client: Client, job_id: str, run_id: str) -> bool:
    try:
        await client.get_workflow_handle(job_id, run_id=run_id).describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            return True
        raise
    return False
