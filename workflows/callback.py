"""The completion callback of a job (docs/design.md, "Clients, inputs and outputs"): a child
workflow that delivers one event with CALLBACK_RETRY. The job starts it at its end, abandoned so
it outlives the job, and awaits only its start: a receiver that is down never holds or fails the
job (an activity merely started by a workflow that then completes is dropped by the server, so
the child is what makes the delivery survive the job)."""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import WorkflowAlreadyStartedError

from workflows.job_state import run_tag

with workflow.unsafe.imports_passed_through():
    from activities.callbacks import (
        CALLBACK_RETRY,
        CALLBACK_TIMEOUT,
        CallbackActivities,
        CallbackDelivery,
        CallbackResult,
        EventName,
        JobEvent,
    )
    from spillway.core import names
    from spillway.core.models import Plan


@workflow.defn(name=names.CALLBACK)
class CallbackWorkflow:
    """One event's delivery; it fails (visibly, in the UI) only after CALLBACK_RETRY gives up."""

    @workflow.run
    async def run(self, delivery: CallbackDelivery) -> CallbackResult:
        return await workflow.execute_activity_method(
            CallbackActivities.job_callback,
            delivery,
            start_to_close_timeout=CALLBACK_TIMEOUT,
            retry_policy=CALLBACK_RETRY,
        )


async def call_back(event: EventName, plan: Plan, url: str | None) -> None:
    """From the end of a job: the delivery id is the same on every retry of this event (and
    another run of the job, a reset, is another delivery)."""
    info = workflow.info()
    delivery = CallbackDelivery(
        url=url,
        delivery_id=f"{info.workflow_id}:{info.run_id}:{event}",
        event=JobEvent(event=event, job_id=plan.job_id, plan=plan.model_dump(mode="json")),
    )
    # A reset that ends the job again while this run's child still runs finds it there.
    with contextlib.suppress(WorkflowAlreadyStartedError):
        await workflow.start_child_workflow(
            CallbackWorkflow.run,
            delivery,
            id=f"{info.workflow_id}-callback-{event}-{run_tag()}",
            parent_close_policy=workflow.ParentClosePolicy.ABANDON,
            execution_timeout=timedelta(hours=3),  # CALLBACK_RETRY gives up well before
        )
