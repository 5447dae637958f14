"""Two cloud providers behind one shape (docs/design.md, "The decision", "Kling facts"): a real
worker process, the dev server, the MiniMax and Kling doubles, the A40 busy and the fallback
armed. A provider that provably made nothing hands the job to the next; Kling's unclear create
is reconciled by its external task id; every create is counted at the doubles; the Kling keys
show nowhere."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from spillway.core.models import Plan
from spillway.sim.kling import KlingSim
from spillway.sim.minimax import MiniMaxSim
from tests.support.cli import spillway, temporal_show
from tests.support.jobs import Jobs, cause_message
from tests.support.kling import CANARY_ACCESS, CANARY_SECRET, KLING_CLIP_USD
from tests.support.waiting import until
from tests.support.worker_process import kill_after_the_create_answer


@pytest.fixture
def both_clouds(cloud_worker, kling: KlingSim):
    """A worker whose A40 is busy, armed, with keys for both providers (MiniMax first)."""
    kling_keys = {
        "KLING_BASE_URL": kling.url,
        "KLING_ACCESS_KEY": CANARY_ACCESS,
        "KLING_SECRET_KEY": CANARY_SECRET,
        "KLING_POLL_INTERVAL_S": "0.2",
        "KLING_CREATE_TIMEOUT_S": "2",  # as FAST_CLOUD's MiniMax: a hanging create costs this
    }

    async def start(**overrides: Any):
        return await cloud_worker(**kling_keys | overrides)

    return start


async def start_job(dev_env: WorkflowEnvironment, task_queue: str) -> Any:
    return await Jobs(dev_env.client, task_queue).start(f"a heron {uuid.uuid4().hex[:6]}")


async def test_minimax_with_no_balance_hands_the_job_to_kling(
    both_clouds, dev_env, minimax: MiniMaxSim, kling: KlingSim
):
    minimax.inject("create", 1008)  # insufficient balance, no task
    kling.units = "2"  # what the task used of the resource pack
    worker = await both_clouds()
    plan: Plan = await asyncio.wait_for((await start_job(dev_env, worker.task_queue)).result(), 90)

    assert (plan.state, plan.route) == ("completed", "cloud")
    assert plan.cloud is not None and plan.cloud.provider == "kling"
    [attempt] = plan.cloud.attempts
    assert attempt.provider == "minimax" and "code 1008" in attempt.why
    assert plan.cloud.estimated_cost_usd == KLING_CLIP_USD
    assert (plan.cloud.units, plan.cloud.cost_usd) == (2.0, None)  # units, never dollars
    assert (minimax.create_calls, minimax.tasks_created) == (1, 0)
    assert (kling.create_calls, kling.tasks_created) == (1, 1)
    assert plan.cloud.task_id is not None
    assert plan.outputs[0].sha256 == kling.sha256_of_task(plan.cloud.task_id)


async def test_both_providers_refusing_fail_the_job_once_with_both_reasons(
    both_clouds, dev_env, minimax: MiniMaxSim, kling: KlingSim
):
    minimax.inject("create", 1008)
    kling.refuse_next_creates(1102)  # resource pack used up
    worker = await both_clouds()
    handle = await start_job(dev_env, worker.task_queue)
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 90)

    message = cause_message(failed)
    assert "every cloud provider refused" in message and "nothing charged" in message
    assert "MiniMax: " in message and "code 1008" in message
    assert "Kling: " in message and "1102" in message
    assert (minimax.tasks_created, kling.tasks_created) == (0, 0)
    assert (minimax.create_calls, kling.create_calls) == (1, 1)


async def test_a_kling_create_that_hangs_after_sending_is_reconciled_to_its_one_task(
    both_clouds, dev_env, kling: KlingSim
):
    kling.fault_next_create("hang")  # Kling made the task; its answer never comes
    worker = await both_clouds(CLOUD_PROVIDERS="kling")
    plan: Plan = await asyncio.wait_for((await start_job(dev_env, worker.task_queue)).result(), 90)
    kling.release()

    assert (plan.state, plan.route) == ("completed", "cloud")
    assert plan.cloud is not None and plan.cloud.provider == "kling"
    assert kling.tasks_created == 1


async def test_a_worker_killed_right_after_klings_create_answer_leaves_one_task(
    both_clouds, dev_env, kling: KlingSim
):
    worker = await both_clouds(CLOUD_PROVIDERS="kling")
    handle = await start_job(dev_env, worker.task_queue)
    await kill_after_the_create_answer(worker, handle, kling)
    assert kling.tasks_created == 1


async def test_a_worker_killed_while_its_kling_create_hangs_leaves_the_job_on_the_task_kling_made(
    both_clouds, dev_env, kling: KlingSim
):
    kling.fault_next_create("hang")  # Kling made the task; its answer never comes
    worker = await both_clouds(CLOUD_PROVIDERS="kling")
    handle = await start_job(dev_env, worker.task_queue)
    await until(lambda: kling.tasks_created >= 1, timeout_s=30)
    await worker.kill()  # the create's answer is lost with it
    await worker.start()
    plan: Plan = await asyncio.wait_for(handle.result(), 90)
    kling.release()

    [task] = kling.tasks.values()
    assert (plan.state, plan.route) == ("completed", "cloud")
    assert plan.cloud is not None and plan.cloud.task_id == task.task_id
    assert f"reconciled_lost_create={task.task_id}" in plan.reasons
    assert (kling.create_calls, kling.tasks_created) == (1, 1)
    _, budget, _ = await spillway("budget", "--json", env=worker.env)
    [entry] = [e for e in json.loads(budget)["entries"] if e["job_id"] == handle.id]
    assert (entry["state"], entry["task_id"]) == ("charged", task.task_id)


async def test_the_kling_keys_never_show_in_history_logs_or_status(
    both_clouds, dev_env, kling: KlingSim
):
    worker = await both_clouds(CLOUD_PROVIDERS="kling")
    handle = await start_job(dev_env, worker.task_queue)
    plan: Plan = await asyncio.wait_for(handle.result(), 90)
    assert plan.cloud is not None and plan.cloud.provider == "kling"

    history = await temporal_show(worker.env, handle.id)
    _, status, _ = await spillway("status", handle.id, "--json", env=worker.env)
    assert json.loads(status)["cloud"]["provider"] == "kling"
    await worker.stop()
    for where, text in {"history": history, "log": worker.log, "status": status}.items():
        for secret in (CANARY_ACCESS, CANARY_SECRET, "CANARY-secret"):
            assert secret not in text, f"{secret!r} in {where}"
    assert all(not h for h in kling.auth_headers["download"])  # no key to the video's host
