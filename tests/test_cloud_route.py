"""The CLOUD route end to end: a real worker process, the dev server, the MiniMax double.
Money invariant 2 under crashes (creates counted by the double) and invariant 3 (the key
nowhere: history, worker log, `spillway status`); with SPILLWAY_APPROVAL_SECRET, only a signed
approval reaches MiniMax, and the secret is nowhere either."""

from __future__ import annotations

import asyncio
import json
import uuid
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.testing import WorkflowEnvironment

from spillway.client import SpillwayClient
from spillway.core.models import Plan
from spillway.core.names import APPROVAL_SIGNAL
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.cli import spillway, temporal_show
from tests.support.constants import BUSY_VRAM_PCT, CANARY_KEY
from tests.support.jobs import Jobs, cause_message
from tests.support.settings import make_settings
from tests.support.waiting import until
from tests.support.worker_process import kill_after_the_create_answer


async def start_job(dev_env: WorkflowEnvironment, task_queue: str) -> Any:
    prompt = f"a lighthouse at dusk {uuid.uuid4().hex[:6]}"
    return await Jobs(dev_env.client, task_queue).start(prompt)


async def test_a_full_cloud_job_never_shows_the_key_anywhere(
    cloud_worker, dev_env, minimax: MiniMaxSim, cli_env
):
    worker = await cloud_worker()
    handle = await start_job(dev_env, worker.task_queue)
    plan: Plan = await asyncio.wait_for(handle.result(), 60)
    assert (plan.route, plan.state) == ("cloud", "completed")
    assert plan.cloud is not None and plan.cloud.task_id is not None
    assert plan.outputs[0].sha256 == minimax.sha256_of_task(plan.cloud.task_id)
    assert minimax.tasks_created == 1

    history = await temporal_show(worker.env, handle.id)
    assert plan.cloud.task_id in history  # payloads decoded: the export holds the whole job
    _, status, _ = await spillway("status", handle.id, "--json", env=worker.env)
    assert json.loads(status)["cloud"]["authorised_by"] == "armed"
    await worker.stop()
    for where, text in {"history": history, "log": worker.log, "status": status}.items():
        assert CANARY_KEY not in text, f"the key leaked into the {where}"


async def test_an_overloaded_job_nobody_approves_never_reaches_minimax(
    worker_process, dev_env, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    comfyui.execution_s = 0.2
    worker = await worker_process(
        COMFYUI_URL=comfyui.url,
        MINIMAX_API_KEY=CANARY_KEY,  # a key, but the fallback is not armed
        MINIMAX_BASE_URL=minimax.url,
        APPROVAL_TIMEOUT_S="3",
        APPROVAL_RECHECK_S="1",
    )
    handle = await start_job(dev_env, worker.task_queue)
    plan: Plan = await asyncio.wait_for(handle.result(), 60)
    assert (plan.state, plan.route) == ("completed", "local")
    assert "approval_timeout" in plan.reasons
    assert (minimax.create_calls, minimax.tasks_created) == (0, 0)


async def test_a_create_that_hangs_fails_the_job_clearly_and_is_never_repeated(
    cloud_worker, dev_env, minimax: MiniMaxSim
):
    minimax.fault_next_create("hang", creates_task=True)
    worker = await cloud_worker()
    handle = await start_job(dev_env, worker.task_queue)
    with pytest.raises(WorkflowFailureError) as failed:
        await asyncio.wait_for(handle.result(), 60)
    assert "a charge may exist" in cause_message(failed)
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)


async def test_a_worker_killed_while_polling_resumes_and_never_creates_again(
    cloud_worker, dev_env, minimax: MiniMaxSim
):
    minimax.set_statuses(["Preparing", *["Processing"] * 15, "Success"])
    worker = await cloud_worker()
    handle = await start_job(dev_env, worker.task_queue)
    await until(lambda: minimax.query_hits >= 3, timeout_s=30)
    await worker.kill()
    await worker.start()
    plan: Plan = await asyncio.wait_for(handle.result(), 90)
    assert plan.state == "completed" and plan.route == "cloud"
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)


async def test_a_worker_killed_right_after_the_create_answer_never_creates_again(
    cloud_worker, dev_env, minimax: MiniMaxSim
):
    worker = await cloud_worker()
    handle = await start_job(dev_env, worker.task_queue)
    await kill_after_the_create_answer(worker, handle, minimax)
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)


async def test_with_the_approval_secret_only_a_signed_approval_reaches_minimax(
    worker_process, dev_env, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    secret = "approval-" + uuid.uuid4().hex
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    worker = await worker_process(
        COMFYUI_URL=comfyui.url,
        MINIMAX_API_KEY=CANARY_KEY,  # a key, the fallback not armed: a person decides
        MINIMAX_BASE_URL=minimax.url,
        MINIMAX_POLL_INTERVAL_S="0.2",
        APPROVAL_TIMEOUT_S="3600",
        SPILLWAY_APPROVAL_SECRET=secret,
    )
    handle = await start_job(dev_env, worker.task_queue)
    jobs = Jobs(dev_env.client, worker.task_queue)
    await jobs.until(handle, "awaiting_approval")
    await handle.signal(APPROVAL_SIGNAL, {"approved": True, "by": "ui-user"})  # as the UI does
    refused = await jobs.until(handle, lambda p: bool(p.ignored_signals))
    assert refused.state == "awaiting_approval" and "unsigned" in refused.ignored_signals[0].why
    assert (minimax.create_calls, minimax.tasks_created) == (0, 0)

    approver = SpillwayClient(
        dev_env.client,
        settings=make_settings(SPILLWAY_APPROVAL_SECRET=secret),
        task_queue=worker.task_queue,
    )
    assert await approver.approve(handle.id, "bär") == "approved"
    plan: Plan = await asyncio.wait_for(handle.result(), 60)
    assert (plan.state, plan.route) == ("completed", "cloud")
    assert plan.approval is not None and plan.approval.signed
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)

    history = await temporal_show(worker.env, handle.id)
    _, status, _ = await spillway("status", handle.id, "--json", env=worker.env)
    await worker.stop()
    assert '"by":"bär"' in history.replace(" ", "")  # payloads decoded
    for where, text in {"history": history, "log": worker.log, "status": status}.items():
        assert secret not in text, f"the approval secret leaked into the {where}"
