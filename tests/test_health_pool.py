"""`spillway health` says how the GPU pool stands (`temporal.gpu_pool`), the way it does for the
spend ledger: not started (normal until a job asks for a GPU place), running with its places and
line, closed (how, and that nothing is lost), a current run too long (it is not continuing as
new), or wedged (its workflow task fails and is retried) with the way back.

All on the real dev server: a pool started beforehand with a book of its own (one place held,
two jobs in line) under the real worker; a pool wedged on purpose by a worker whose
SpillwayGpuPoolWorkflow raises a plain exception, which fails the workflow task again and again."""

from __future__ import annotations

import json
import shlex
import uuid
from datetime import UTC, datetime
from typing import Any

import pytest
from temporalio import workflow
from temporalio.client import WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from spillway.cli.health import Health
from spillway.cli.pool_health import pool_health, pool_remedy, pool_start_command
from spillway.cli.render import render_health
from spillway.core import names
from spillway.core.gpu_pool import Holder, PoolAsk, PoolInput
from spillway.core.hosts import gpu_hosts
from spillway.core.tiers import load_tiers
from spillway.sim.comfyui import ComfyUISim
from tests.support.cli import spillway, temporal
from tests.support.jobs import reset_to_first_workflow_task
from tests.support.settings import comfyui_values, make_settings
from tests.support.waiting import until
from worker import serving

pytestmark = pytest.mark.full

LINE_CHECK_S = 300.0  # SPILLWAY_POOL_LINE_CHECK_S's default, which health names
BROKEN = "this release's GpuPoolWorkflow cannot replay the pool's history"


@workflow.defn(name=names.GPU_POOL)
class WedgedPool:
    """A pool whose every workflow task fails, as after a deploy that does not replay it."""

    @workflow.run
    async def run(self, inp: PoolInput) -> None:
        raise RuntimeError(BROKEN)  # not a Temporal failure: the task fails and is retried


def a_queue() -> str:
    return f"pool-health-{uuid.uuid4().hex[:12]}"


async def attempt(handle: WorkflowHandle[Any, Any]) -> int:
    """The attempt of the pool's pending workflow task (0: none pending)."""
    return (await handle.describe()).raw_description.pending_workflow_task.attempt


async def test_no_job_asked_yet_the_pool_is_not_started_and_nothing_is_wrong(
    dev_env: WorkflowEnvironment,
):
    queue = a_queue()

    found = await pool_health(dev_env.client, queue, line_check_s=LINE_CHECK_S)

    assert found.model_dump() == {
        "state": "not_started",
        "workflow_id": names.pool_id(queue),
        "run_id": None,
        "status": None,
        "history_length": None,
        "long_history": False,
        "continue_as_new_suggested": None,
        "places_in_use": None,
        "line_length": None,
        "drained": {},
        "wedged": None,
        "reset_from": None,
        "error": None,
    }


async def test_a_running_pool_shows_its_places_and_line_and_once_terminated_says_it_is_closed(
    dev_env: WorkflowEnvironment, comfyui: ComfyUISim, gpu: Any, cli_env, tmp_path
):
    client = dev_env.client
    settings = make_settings(
        comfyui_values(comfyui, tmp_path / "out"), SPILLWAY_TASK_QUEUE=a_queue(), A40_MAX_JOBS=1
    )
    queue, tiers = settings.SPILLWAY_TASK_QUEUE, load_tiers(settings.SPILLWAY_ROUTING_TIERS)
    pool_id = names.pool_id(queue)
    [host] = gpu_hosts(settings, tiers)
    now = datetime.now(UTC)
    # The host's one place held and two jobs in line: nothing frees a place or needs a probe.
    book = PoolInput(
        holders=[
            Holder(job_id="rendering", asked_at=now, host=host.name, since=now, checked_at=now)
        ],
        line=[PoolAsk(job_id=f"waiting-{n}", asked_at=now, mode="any") for n in (1, 2)],
    )
    env = cli_env(
        TEMPORAL_ADDRESS=client.service_client.config.target_host,
        SPILLWAY_TASK_QUEUE=queue,
        COMFYUI_URL=comfyui.url,
    )
    async with serving(client, settings, tiers, gpu=gpu):
        started = await client.start_workflow(
            names.GPU_POOL, book, id=pool_id, task_queue=names.pool_queue(queue)
        )
        # Until its first workflow task is in the history, the suggestion is not known (None).
        found = await until(
            lambda: pool_health(client, queue, line_check_s=LINE_CHECK_S),
            lambda f: f.places_in_use is not None and f.continue_as_new_suggested is not None,
        )
        assert (found.state, found.status, found.run_id) == (
            "running",
            "RUNNING",
            started.result_run_id,
        )
        assert (found.places_in_use, found.line_length) == (1, 2)
        assert found.history_length is not None and found.history_length > 0
        assert (found.long_history, found.continue_as_new_suggested) == (False, False)
        assert (found.wedged, found.error) == (None, None)

        # Past the threshold (lowered here to this run's length) it says the run is too long.
        long = await pool_health(
            client, queue, line_check_s=LINE_CHECK_S, long_history=found.history_length - 1
        )
        assert long.long_history and long.places_in_use == 1
        assert long.error is not None
        for said in (
            f"the GPU pool ({pool_id}, run {started.result_run_id}) has",
            "it is not continuing as new",
            f"`temporal workflow terminate --workflow-id {pool_id}`",
        ):
            assert said in long.error, (said, long.error)

        # The command shows it, exits 0, and the text names the places and the line.
        code, out, err = await spillway("health", "--json", env=env)
        assert code == 0, err
        shown = json.loads(out)["temporal"]["gpu_pool"]
        assert (shown["state"], shown["places_in_use"], shown["line_length"]) == ("running", 1, 2)
        assert shown["long_history"] is False and shown["error"] is None
        text = render_health(Health.model_validate_json(out))
        assert (
            f"GPU pool: running ({pool_id}, run {started.result_run_id}, "
            f"{shown['history_length']} events in this run); 1 place(s) in use, 2 job(s) in line"
        ) in text

        await started.terminate(reason="test_health_pool: an operator ends the pool")
        closed = await pool_health(client, queue, line_check_s=LINE_CHECK_S)
        assert (closed.state, closed.status, closed.run_id) == (
            "closed",
            "TERMINATED",
            started.result_run_id,
        )
        assert (closed.places_in_use, closed.line_length, closed.wedged) == (None, None, None)
        assert closed.error is not None
        for said in (
            f"the GPU pool ({pool_id}, run {started.result_run_id}) is closed (TERMINATED)",
            "nothing is lost",
            "a give-back at the end of a render",
            "starts a new pool, which takes back the places still held",
            "a job in line is admitted within seconds of a holder's end",
            "at the latest when a job in line asks again, within 5 minutes",
            pool_start_command(queue),
        ):
            assert said in closed.error, (said, closed.error)
        code, out, err = await spillway("health", "--json", env=env)
        assert code == 0, err
        assert json.loads(out)["temporal"]["gpu_pool"]["state"] == "closed"
        text = render_health(Health.model_validate_json(out))
        assert f"GPU pool: CLOSED (TERMINATED)\n  {closed.error}\n" in text

        # The command it names starts a pool before any job asks.
        await temporal(env, *shlex.split(pool_start_command(queue))[1:])
        back = await until(
            lambda: pool_health(client, queue, line_check_s=LINE_CHECK_S),
            lambda f: f.state == "running" and f.places_in_use is not None,
        )
        assert back.run_id != started.result_run_id
        assert (back.places_in_use, back.line_length, back.error) == (0, 0, None)
        await client.get_workflow_handle(pool_id).terminate(reason="test_health_pool: done")


async def test_a_wedged_pool_is_named_with_the_way_back(dev_env: WorkflowEnvironment, cli_env):
    client = dev_env.client
    queue = a_queue()
    pool_id = names.pool_id(queue)
    env = cli_env(TEMPORAL_ADDRESS=client.service_client.config.target_host)
    async with Worker(
        client,
        task_queue=names.pool_queue(queue),
        workflows=[WedgedPool],
        workflow_runner=UnsandboxedWorkflowRunner(),  # its own code, in this test's module
    ):
        started = await client.start_workflow(
            WedgedPool.run, PoolInput(), id=pool_id, task_queue=names.pool_queue(queue)
        )
        await until(lambda: attempt(started), lambda a: a > 1, timeout_s=120, every_s=0.2)

    found = await pool_health(client, queue, line_check_s=LINE_CHECK_S)

    assert (found.state, found.status, found.run_id) == (
        "running",
        "RUNNING",
        started.result_run_id,
    )
    wedged = found.wedged
    assert wedged is not None
    assert (wedged.workflow_id, wedged.run_id) == (pool_id, started.result_run_id)
    assert wedged.attempt >= 2 and wedged.failing_since is not None
    assert (wedged.cause, wedged.failure) == ("WORKFLOW_WORKER_UNHANDLED_FAILURE", BROKEN)
    assert wedged.remedy == pool_remedy(pool_id, LINE_CHECK_S)
    assert (found.places_in_use, found.line_length) == (None, None)  # not asked: it cannot answer
    assert found.error is not None
    for said in (
        f"the GPU pool ({pool_id}, run {started.result_run_id}) is wedged",
        f"attempt {wedged.attempt}",
        BROKEN,
        "no job gets a GPU place",
        f"`temporal workflow terminate --workflow-id {pool_id}`",
        "nothing is lost",
        "starts a new pool, which takes back the places still held",
        "at the latest when a job in line asks again, within 5 minutes",
    ):
        assert said in found.error, (said, found.error)

    # The way back it names: terminate with the temporal CLI; the pool is then closed, not wedged.
    await temporal(env, "workflow", "terminate", "--workflow-id", pool_id)
    closed = await pool_health(client, queue, line_check_s=LINE_CHECK_S)
    assert (closed.state, closed.status, closed.wedged) == ("closed", "TERMINATED", None)


async def test_a_pool_made_by_a_reset_is_named_with_the_way_back(
    dev_env: WorkflowEnvironment, comfyui: ComfyUISim, gpu: Any, tmp_path
):
    """A reset pool's book is the reset point's: places handed out since are not in it."""
    client = dev_env.client
    settings = make_settings(
        comfyui_values(comfyui, tmp_path / "out"), SPILLWAY_TASK_QUEUE=a_queue()
    )
    queue, tiers = settings.SPILLWAY_TASK_QUEUE, load_tiers(settings.SPILLWAY_ROUTING_TIERS)
    pool_id = names.pool_id(queue)
    async with serving(client, settings, tiers, gpu=gpu):
        started = await client.start_workflow(
            names.GPU_POOL, PoolInput(), id=pool_id, task_queue=names.pool_queue(queue)
        )
        first = await until(
            lambda: pool_health(client, queue, line_check_s=LINE_CHECK_S),
            lambda f: f.continue_as_new_suggested is not None,
        )
        assert (first.reset_from, first.error) == (None, None)
        await reset_to_first_workflow_task(client, pool_id)
        found = await until(
            lambda: pool_health(client, queue, line_check_s=LINE_CHECK_S),
            lambda f: f.run_id != started.result_run_id,
        )
        await client.get_workflow_handle(pool_id).terminate(reason="test_health_pool: done")
    assert found.reset_from == started.result_run_id
    assert found.error is not None and "made by a reset" in found.error
    assert pool_remedy(pool_id, LINE_CHECK_S) in found.error
