"""The spend ledger's history replays when a query splits a workflow task in two (docs/design.md,
"Facts found while building").

A query the server hands straight to a worker, while no workflow task is pending, carries the
events written until a worker polls it: core applies the vet's result in that query's activation,
and the answers and the next vet go out with the workflow task that follows. An update that task
brings was accepted after them; on replay it came in the same activation as the vet's result and
was accepted before them, and the history no longer replayed ("UpdateMachine in state
AcceptCommandCreated ..."): a wedged ledger after the next worker restart, seen under load in the
300-job scenario. The ledger now turns such an update away (nothing in the history) and the
caller asks again.

Each attempt sets the race up on the real dev server: the vet of update A waits at a gate, B
waits in the inbox, the ledger's worker stops, a query is sent, the gate opens, update C is sent,
the worker starts. Whether the query task or the workflow task reaches the worker first is the
server's choice; the test runs attempts until one split (C turned away), and every history it
made must replay."""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowUpdateFailedError
from temporalio.exceptions import ApplicationError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Replayer, UnsandboxedWorkflowRunner, Worker

from activities.spend.vet import VetAnswers, VetBatch
from spillway.core import names
from spillway.core.ledger import Budgets, LedgerInput, Vetted
from tests.support.waiting import until
from workflows.spend_ledger import UNSETTLED, SpendLedgerWorkflow

SPLIT_WITHIN_S = 300  # each attempt takes a few seconds; about one in three splits
# Pacing, not waits for a condition (neither a query nor an update waiting for a worker shows
# on the server): the query must reach the server before the vet's result does, and C before
# the worker starts. An attempt where they land otherwise has no split, and the next is made.
PACE_S = 0.5


class Vet:
    """The vet as the ledger sees it (same name, same models), its first answer held at a gate."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.held = False

    @activity.defn(name=names.LEDGER_VET)
    async def vet(self, batch: VetBatch) -> VetAnswers:
        if not self.held:
            self.held = True
            await self.gate.wait()
        return VetAnswers(answers=[Vetted(budgets=Budgets(daily_usd=5)) for _ in batch.requests])


async def configure(handle: WorkflowHandle[Any, Any], turned_away: list[str], name: str) -> None:
    """`configure`, asked again while the ledger turns it away, as the workers' calls do."""
    while True:
        try:
            await handle.execute_update(names.LEDGER_CONFIGURE, id=f"{name}-{uuid.uuid4().hex}")
            return
        except WorkflowUpdateFailedError as err:
            cause = err.cause
            if not (isinstance(cause, ApplicationError) and cause.type == UNSETTLED):
                raise
            turned_away.append(name)


async def recorded(handle: WorkflowHandle[Any, Any], kind: EventType.ValueType) -> int:
    """How many events of `kind` the history holds."""
    history = await handle.fetch_history()
    return sum(e.event_type == kind for e in history.events)


async def attempt(client: Client, queue: str, vet: Vet) -> tuple[WorkflowHandle[Any, Any], bool]:
    """One attempt at the race; the ledger's handle, and whether C was turned away."""

    def ledger_worker() -> Worker:
        return Worker(
            client,
            task_queue=queue,
            workflows=[SpendLedgerWorkflow],
            workflow_runner=UnsandboxedWorkflowRunner(),  # as worker.py runs it
        )

    turned_away: list[str] = []
    async with ledger_worker():
        handle = await client.start_workflow(
            SpendLedgerWorkflow.run, LedgerInput(), id=f"split-{uuid.uuid4().hex}", task_queue=queue
        )
        a = asyncio.create_task(configure(handle, turned_away, "A"))
        await until(lambda: vet.held, timeout_s=60, what="A's vet")
        b = asyncio.create_task(configure(handle, turned_away, "B"))
        await until(
            lambda: recorded(handle, EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED),
            lambda n: n >= 2,
            timeout_s=60,
            what="B accepted",
        )
    query = asyncio.create_task(
        handle.query(names.LEDGER_BUDGETS, result_type=Budgets, rpc_timeout=timedelta(seconds=120))
    )
    await asyncio.sleep(PACE_S)
    vet.gate.set()
    await until(
        lambda: recorded(handle, EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED),
        timeout_s=60,
        what="the vet's result recorded",
    )
    c = asyncio.create_task(configure(handle, turned_away, "C"))
    await asyncio.sleep(PACE_S)
    async with ledger_worker():
        await query
        async with asyncio.timeout(120):
            await asyncio.gather(a, b, c)
    return handle, "C" in turned_away


async def test_an_update_in_a_workflow_task_split_by_a_query_leaves_a_history_that_replays(
    dev_env: WorkflowEnvironment,
):
    client = dev_env.client
    queue = f"split-{uuid.uuid4().hex[:8]}"
    replayer = Replayer(
        workflows=[SpendLedgerWorkflow],
        data_converter=client.data_converter,
        workflow_runner=UnsandboxedWorkflowRunner(),
    )
    vet = Vet()
    splits = attempts = 0
    async with Worker(client, task_queue=names.vet_queue(queue), activities=[vet.vet]):
        async with asyncio.timeout(SPLIT_WITHIN_S):
            while not splits:
                vet.gate.clear()
                vet.held = False
                handle, split = await attempt(client, queue, vet)
                attempts += 1
                splits += split
                result = await replayer.replay_workflow(
                    await handle.fetch_history(), raise_on_replay_failure=False
                )
                assert result.replay_failure is None, (attempts, split, result.replay_failure)
                await handle.terminate("the attempt is over")
