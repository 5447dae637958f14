"""Tiny workflows around the completion callback: JobThatCallsBack hands a given delivery to the
real child (workflows/callback.py: CallbackWorkflow) as VideoJobWorkflow does at its end;
FireAndForget is the tempting shortcut that loses the event."""

from __future__ import annotations

import contextlib
from datetime import timedelta

from temporalio import workflow
from temporalio.exceptions import WorkflowAlreadyStartedError

with workflow.unsafe.imports_passed_through():
    from activities.callbacks import (
        CALLBACK_RETRY,
        CALLBACK_TIMEOUT,
        CallbackDelivery,
        CallbackResult,
    )
    from spillway.core import names
    from workflows.callback import CallbackWorkflow


@workflow.defn
class JobThatCallsBack:
    """Stands in for the end of VideoJobWorkflow: the outcome is known, the callback is handed
    to a child that outlives this run, and the job returns without waiting for the receiver."""

    @workflow.run
    async def run(self, delivery: CallbackDelivery) -> str:
        # Awaits only the child's start (one round trip), never its delivery. A reset that
        # replays this start while the child still runs finds it there: already under way.
        with contextlib.suppress(WorkflowAlreadyStartedError):
            await workflow.start_child_workflow(
                CallbackWorkflow.run,
                delivery,
                id=f"{workflow.info().workflow_id}-callback-{delivery.event.event}",
                parent_close_policy=workflow.ParentClosePolicy.ABANDON,
                execution_timeout=timedelta(hours=3),  # CALLBACK_RETRY gives up well before
            )
        return "completed"


@workflow.defn
class FireAndForget:
    """The shortcut that does not work at a workflow's end: the activity is scheduled, the
    workflow completes in the same task, and the server drops the activity with the run."""

    @workflow.run
    async def run(self, delivery: CallbackDelivery) -> str:
        workflow.start_activity(
            names.JOB_CALLBACK,
            delivery,
            result_type=CallbackResult,
            start_to_close_timeout=CALLBACK_TIMEOUT,
            retry_policy=CALLBACK_RETRY,
        )
        return "completed"
