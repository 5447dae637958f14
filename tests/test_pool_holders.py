"""The GPU pool's holder check (activities/pool.py) against the dev server: a place is held only
by a running spillway job of the pool's own queue, whoever asked in another workflow's name."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

from temporalio.testing import ActivityEnvironment, WorkflowEnvironment

from activities.pool import HolderCheck, PoolActivities
from spillway import names
from spillway.gpu_pool import Holder


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
