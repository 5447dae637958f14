"""The GPU pool's activities (activities/pool.py) against the dev server: a place is held only by
a running spillway job of the pool's own queue, whoever asked in another workflow's name; and a
pool started under spillway's id where no spillway worker polls is ended by the next ask, and its
word that a job is late is not taken."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime

from temporalio.client import WorkflowExecutionStatus
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.pool import HolderCheck, PoolActivities
from spillway.core import names
from spillway.core.gpu_pool import Holder, LateCheck, PoolAsk, PoolInput


def _holder(job_id: str) -> Holder:
    now = datetime.now(UTC)
    return Holder(job_id=job_id, asked_at=now, host="a40_local", since=now, checked_at=now)


async def test_a_place_held_in_the_name_of_a_workflow_that_is_not_a_job_of_this_queue_is_free(
    dev_env: WorkflowEnvironment,
):
    client = dev_env.client
    unpolled = f"nobody-polls-{uuid.uuid4()}"
    # Running (nobody polls their queue, so they stay so): not a job, and a job of another queue.
    ledger_like = await client.start_workflow(
        names.SPEND_LEDGER, id=f"not-a-job-{uuid.uuid4()}", task_queue=unpolled
    )
    elsewhere = await client.start_workflow(
        names.VIDEO_JOB, id=f"job-elsewhere-{uuid.uuid4()}", task_queue=unpolled
    )
    check = HolderCheck(
        holders=[_holder(ledger_like.id), _holder(elsewhere.id), _holder("never-started")],
        task_queue="spillway",
    )
    try:
        checked = await ActivityEnvironment().run(PoolActivities(client).check_holders, check)
    finally:
        for handle in (ledger_like, elsewhere):
            await handle.terminate(reason="test_pool_holders: done")
    assert sorted(checked.gone) == sorted([ledger_like.id, elsewhere.id, "never-started"])
    assert checked.answered == []


async def test_an_ask_unanswered_by_a_pool_on_a_foreign_queue_ends_it_and_starts_spillway_s(
    dev_env: WorkflowEnvironment,
):
    client = dev_env.client
    queue = f"spillway-{uuid.uuid4()}"
    pool_id = names.pool_id(queue)
    foreign = await client.start_workflow(
        names.GPU_POOL, PoolInput(), id=pool_id, task_queue=f"nobody-polls-{uuid.uuid4()}"
    )
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(environment.info, task_queue=queue)
    ask = PoolAsk(job_id="waits-for-an-answer", asked_at=datetime.now(UTC))
    await environment.run(PoolActivities(client).start, ask)
    ended = client.get_workflow_handle(pool_id, run_id=foreign.result_run_id)
    assert (await ended.describe()).status == WorkflowExecutionStatus.TERMINATED
    ours = await client.get_workflow_handle(pool_id).describe()
    try:
        assert ours.status == WorkflowExecutionStatus.RUNNING
        assert ours.task_queue == names.pool_queue(queue) and ours.run_id != foreign.result_run_id
    finally:
        await client.get_workflow_handle(pool_id).terminate(reason="test_pool_activities: done")


async def test_no_pool_or_one_started_by_anyone_on_a_foreign_queue_confirms_no_job_late(
    dev_env: WorkflowEnvironment,
):
    client = dev_env.client
    queue = f"spillway-{uuid.uuid4()}"
    environment = ActivityEnvironment()
    environment.info = dataclasses.replace(environment.info, task_queue=queue)
    ask = PoolAsk(job_id="patient", asked_at=datetime.now(UTC), start_by=datetime.now(UTC))
    confirm = PoolActivities(client).confirm_late
    assert await environment.run(confirm, ask) == LateCheck()  # no pool at all
    # Started under spillway's id where anyone's worker could answer its queries.
    foreign = await client.start_workflow(
        names.GPU_POOL, PoolInput(), id=names.pool_id(queue), task_queue=f"theirs-{uuid.uuid4()}"
    )
    try:
        assert await environment.run(confirm, ask) == LateCheck()
    finally:
        await foreign.terminate(reason="test_pool_activities: done")
