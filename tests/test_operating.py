"""Operating the fleet end to end: two ComfyUI doubles, the worker and both agents on the real
dev server. `spillway host drain|resume|list`: a drained host's holders finish and nothing new
reaches its ComfyUI; the line goes to the other host, and back once it is resumed; the drain
outlives the pool's continue-as-new and a terminate and restart. `spillway priority`: a job in
line moves at once, and so does the priority the Temporal UI shows; one holding a place refuses."""

from __future__ import annotations

import itertools
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from activities.heartbeat import PROGRESS_EVERY_S
from spillway.client import jobs as job_ops
from spillway.client.hosts import set_drain
from spillway.client.queue import pool_view
from spillway.core import names
from spillway.core.errors import ConfigError
from spillway.core.gpu_pool import PoolDrain, PoolInput, PoolView
from spillway.core.models import CloudRequest, Plan, VideoJob
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.cli import spillway as cli
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import Jobs, cause_message
from tests.support.one_host import one_host
from tests.support.two_hosts import two_hosts
from tests.support.waiting import until

pytestmark = pytest.mark.full

UI_METADATA = "__temporal_workflow_metadata"  # what the Temporal UI queries for current details
DRAIN = PoolDrain(host="gpu-a", drain=True, by="ops", reason="driver update")


class Fleet:
    def __init__(self, client: Client, queue: str, a: ComfyUISim, b: ComfyUISim) -> None:
        self.client, self.queue, self.a, self.b = client, queue, a, b
        self.jobs = Jobs(client, queue)

    async def start(self) -> WorkflowHandle[Any, Plan]:
        job = VideoJob(job_id=f"drain-{uuid.uuid4().hex[:10]}", graph=VIDEO_GRAPH)
        return await job_ops.submit(self.client, job, self.queue)

    async def view(self) -> PoolView:
        return await pool_view(self.client, self.queue)

    async def view_is(self, want: Callable[[PoolView], bool], what: str) -> PoolView:
        return await until(self.view, want, timeout_s=60, what=what)


@pytest.fixture
def fleet(dev_env: WorkflowEnvironment, gpu: Any, tmp_path: Path) -> Callable[..., Any]:
    @asynccontextmanager
    async def run(b_render_s: float = 0.3, **overrides: Any) -> AsyncIterator[Fleet]:
        async with two_hosts(dev_env.client, gpu, tmp_path, (2, 1), **overrides) as hosts:
            b = hosts.b
            b.execution_s = b_render_s
            # An interrupt stops a render within a second, as at a sampler's steps.
            b.progress_nodes |= {node["class_type"] for node in VIDEO_GRAPH.values()}
            b.progress_steps = max(1, round(b_render_s / len(VIDEO_GRAPH)))
            yield Fleet(dev_env.client, hosts.queue, hosts.a, b)

    return run


def places(view: PoolView) -> dict[str, list[str]]:
    return {h.name: [p.job_id for p in h.places] for h in view.hosts}


async def test_a_drained_host_finishes_its_holders_takes_nothing_new_and_resumes_after_a_restart(
    fleet, cli_env, dev_env
):
    # gpu-b's renders hold its place until they are cancelled.
    async with fleet(b_render_s=600, SPILLWAY_POOL_LINE_CHECK_S=2) as fl:
        fl.a.pause()  # gpu-a's holders stay pending until the drain is in place
        holders = [await fl.start() for _ in range(3)]
        for holder in holders:
            await fl.jobs.until(holder, "running_local")
        waiting = [await fl.start() for _ in range(3)]
        await fl.view_is(lambda v: len(v.line) == 3, "three in line")
        env = cli_env(
            TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
            SPILLWAY_TASK_QUEUE=fl.queue,
        )
        code, out, err = await cli(
            "host", "drain", "gpu-a", "--by", "ops", "--reason", "driver update", env=env
        )
        assert code == 0 and out.startswith("host gpu-a drained by ops since "), err
        assert "driver update: 2 of 2 places held" in out
        view = await fl.view()
        assert (
            view.line[0].why == "places taken (gpu-b 1/1); host gpu-a drained by ops: driver update"
        )
        # gpu-a's holders finish; nothing new reaches it.
        on_a = set(places(view)["gpu-a"])
        fl.a.resume()
        await fl.view_is(lambda v: not places(v)["gpu-a"], "gpu-a's places empty")
        # gpu-b's place frees (its holder cancelled): the head of the line goes there.
        on_b = next(h for h in holders if h.id not in on_a)
        await on_b.cancel()
        order = [next(w for w in waiting if w.id == i.job_id) for i in view.line]
        await fl.jobs.until(order[0], "running_local")
        assert [i.job_id for i in (await fl.view()).line] == [w.id for w in order[1:]]
        # The operator's remedy for a wedged pool: the next pool still has gpu-a drained.
        pool = fl.client.get_workflow_handle(names.pool_id(fl.queue))
        await pool.terminate(reason="operator")
        view = await fl.view_is(
            lambda v: v.pool == "running" and len(v.line) == 2, "a new pool with the line"
        )
        drained = {h.name: h.drained for h in view.hosts}["gpu-a"]
        assert drained is not None and (drained.by, drained.reason) == ("ops", "driver update")
        code, out, err = await cli("host", "list", "--json", env=env)
        listed = {h["name"]: h for h in json.loads(out)["hosts"]}
        assert code == 0 and listed["gpu-a"]["drained"]["by"] == "ops", err
        posts_on_a = len(fl.a.prompt_posts)
        assert posts_on_a == 2  # its two holders', nothing since the drain
        # Resumed: the line moves back to gpu-a.
        await set_drain(fl.client, fl.queue, DRAIN.model_copy(update={"drain": False}))
        plans = [await w.result() for w in order[1:]]
        await order[0].cancel()
    assert [p.host for p in plans] == ["gpu-a", "gpu-a"]
    assert len(fl.a.prompt_posts) == posts_on_a + 2


async def test_a_drain_outlives_the_pool_s_continue_as_new_and_names_only_known_hosts(fleet):
    async with fleet() as fl:
        # A pool that ends its run every 3 signals.
        await fl.client.start_workflow(
            names.GPU_POOL,
            PoolInput(signals_per_run=3),
            id=names.pool_id(fl.queue),
            task_queue=names.pool_queue(fl.queue),
        )
        first = (await fl.client.get_workflow_handle(names.pool_id(fl.queue)).describe()).run_id
        await set_drain(fl.client, fl.queue, DRAIN)
        plans = [await (await fl.start()).result() for _ in range(3)]
        view = await fl.view()
        latest = (await fl.client.get_workflow_handle(names.pool_id(fl.queue)).describe()).run_id
        with pytest.raises(ConfigError, match="no GPU host 'gpu-c': the workers have gpu-a, gpu-b"):
            await set_drain(fl.client, fl.queue, DRAIN.model_copy(update={"host": "gpu-c"}))
    assert latest != first  # it continued as new
    assert {h.name: h.drained is not None for h in view.hosts} == {"gpu-a": True, "gpu-b": False}
    assert [p.host for p in plans] == ["gpu-b"] * 3 and not fl.a.prompt_posts


async def test_spillway_priority_moves_a_job_from_third_to_first_and_a_running_one_refuses(
    fleet, cli_env, dev_env
):
    async with fleet(b_render_s=600) as fl:
        fl.a.pause()  # every place held: gpu-a's two pending, gpu-b's rendering
        holders = [await fl.start() for _ in range(3)]
        for holder in holders:
            await fl.jobs.until(holder, "running_local")
        waiting = [await fl.start() for _ in range(3)]
        for w in waiting:
            await fl.jobs.until(w, "queued")
        view = await fl.view_is(lambda v: len(v.line) == 3, "three in line")
        third = view.line[2].job_id
        env = cli_env(
            TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
            SPILLWAY_TASK_QUEUE=fl.queue,
        )
        code, out, err = await cli(
            "priority", third, "1", "--by", "producer", "--reason", "client call", env=env
        )
        assert (code, out.strip()) == (0, f"job {third}: priority 1, 1 in line (0 ahead)"), err
        assert err == ""  # this server changes the workflow's Temporal priority: nothing to say
        assert (await fl.view()).line[0].job_id == third
        # What the Temporal UI shows as the job's priority follows.
        described = await fl.client.get_workflow_handle(third).describe()
        assert described.raw_description.workflow_execution_info.priority.priority_key == 1
        plan = await job_ops.status(fl.client, third)
        [change] = plan.priority_changes
        assert (change.priority, change.was, change.by, change.reason) == (
            1,
            3,
            "producer",
            "client call",
        )
        code, out, err = await cli("status", third, env=env)
        assert "  priority  1 (was 3) by producer at " in out
        # A job that holds its place refuses (exit 1), naming its state.
        code, out, err = await cli("priority", holders[0].id, "1", "--by", "producer", env=env)
        assert code == 1 and f"job {holders[0].id} is running_local: only a job waiting" in err
        # The first place that frees goes to it.
        fl.a.resume()
        first = await fl.client.get_workflow_handle(third, result_type=Plan).result()
        others = [await w.result() for w in waiting if w.id != third]
        for holder in holders:
            await holder.cancel()
    assert first.host == "gpu-a" and all(p.host == "gpu-a" for p in others)


@pytest.fixture
def single(
    dev_env: WorkflowEnvironment,
    comfyui: ComfyUISim,
    minimax: MiniMaxSim,
    gpu: Any,
    tmp_path: Path,
) -> Callable[..., Any]:
    comfyui.execution_s = 0.3

    @asynccontextmanager
    async def run(**overrides: Any) -> AsyncIterator[Jobs]:
        overrides = {"RENDER_STALL_S": 1} | overrides
        async with one_host(
            dev_env.client, comfyui, minimax, gpu, tmp_path, **overrides
        ) as settings:
            yield Jobs(dev_env.client, settings.SPILLWAY_TASK_QUEUE)

    return run


async def start(jobs: Jobs, cloud: bool = False) -> WorkflowHandle[Any, Plan]:
    job = VideoJob(
        job_id=f"stall-{uuid.uuid4().hex[:10]}",
        graph=VIDEO_GRAPH,
        cloud=CloudRequest(prompt="a lighthouse at dusk") if cloud else None,
    )
    return await job_ops.submit(jobs.client, job, jobs.task_queue)


async def test_a_stalled_render_is_interrupted_and_tried_once_more_on_its_place(
    single, comfyui: ComfyUISim
):
    comfyui.stall_next = 1  # the first prompt hangs in its first node, silent
    async with single() as jobs:
        plan = await (await start(jobs)).result()
    assert plan.prompt_id is not None
    first = plan.prompt_id.removesuffix("-2") + "-1"
    assert (plan.state, plan.local_attempts, plan.host) == ("completed", 2, "a40_local")
    assert "render_stalled=a40_local" in plan.reasons
    # Only the stalled prompt was interrupted, once; the second try ran to its end.
    assert comfyui.interrupts == [first]
    assert comfyui.prompt_posts[first] == 1 and comfyui.state_of(first) == "done"


async def test_a_second_stall_fails_the_job_naming_the_host(single, comfyui: ComfyUISim):
    comfyui.stall_next = 2
    async with single() as jobs:
        handle = await start(jobs)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    message = cause_message(failed)
    assert message.startswith("the render on GPU host a40_local stalled twice (its render made")
    assert len(comfyui.interrupts) == 2 and len(set(comfyui.interrupts)) == 2


async def test_an_armed_job_whose_render_stalls_goes_to_the_cloud_with_one_create(
    single, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.stall_next = 1
    async with single(CLOUD_VIDEO_FALLBACK_ENABLED=True) as jobs:
        plan = await (await start(jobs, cloud=True)).result()
    assert (plan.state, plan.route) == ("completed", "cloud")
    assert "render_stalled=a40_local" in plan.reasons and plan.overflow.trigger == "unreachable"
    assert sum(minimax.create_calls_by_prompt.values()) == 1
    assert len(comfyui.interrupts) == 1 and len(comfyui.prompt_posts) == 1


async def test_a_render_s_progress_reaches_the_ui_s_current_details_once_per_1_5_s_at_most(
    single, comfyui: ComfyUISim
):
    comfyui.execution_s = 6
    comfyui.progress_steps = 12
    async with single(RENDER_STALL_S=900) as jobs:
        handle = await start(jobs)

        async def details() -> str:
            metadata = await handle.query(UI_METADATA, result_type=WorkflowMetadata)
            return str(metadata.current_details)

        shown = await until(
            details, lambda text: "Progress: " in text, timeout_s=60, what="the UI's progress"
        )
        plan = await handle.result()
        history = await handle.fetch_history()
        ended = await details()
    assert shown.startswith("**Rendering locally** on GPU host `a40_local`"), shown
    assert plan.state == "completed" and "Progress" not in ended
    relayed = [
        e.event_time.ToDatetime()
        for e in history.events
        if e.workflow_execution_signaled_event_attributes.signal_name
        == names.RENDER_PROGRESS_SIGNAL
    ]
    # The relay waits for the server's answer, then PROGRESS_EVERY_S, before the next.
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(relayed)]
    assert relayed and all(gap >= PROGRESS_EVERY_S for gap in gaps), gaps
