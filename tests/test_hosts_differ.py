"""Hosts that differ (issue 46): a job goes only where its graph can run. Two ComfyUI doubles,
`gpu-a` without the custom node FilmGrainLite and the checkpoint, `gpu-b` with both, each read by
its own agent (`comfyui_fit`: `GET /object_info`), the worker on the real dev server. The doubles
refuse what they lack as ComfyUI does, so a job sent to the wrong host would fail."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError, WorkflowHandle
from temporalio.testing import WorkflowEnvironment

from spillway.cli.render import capabilities_brief, render_plan
from spillway.client import jobs as job_ops
from spillway.client.queue import pool_view
from spillway.core.models import Plan, VideoJob
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.comfyui_graph import Host
from tests.support.graphs import GRAIN_GRAPH, VIDEO_GRAPH
from tests.support.jobs import Jobs, cause_message
from tests.support.two_hosts import two_hosts
from tests.support.waiting import until
from workflows.health import HealthWorkflow

pytestmark = pytest.mark.full

CHECKPOINT = "only-on-b.safetensors"
# GRAIN_GRAPH's output also depends on a checkpoint only gpu-b has (a link by position only: the
# double, like the match, follows links without checking their types).
ON_A_CHECKPOINT = GRAIN_GRAPH | {
    "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": CHECKPOINT}},
    "3": {
        "class_type": "FilmGrainLite",
        "inputs": {"images": ["1", 0], "grain": "fine", "model": ["4", 0]},
    },
}
B_HAS = Host(nodes=Host().nodes | {"FilmGrainLite"}, models={"checkpoints": (CHECKPOINT,)})


class Studio:
    def __init__(self, env: WorkflowEnvironment, queue: str, a: ComfyUISim, b: ComfyUISim):
        self.client, self.queue, self.a, self.b = env.client, queue, a, b
        self.jobs = Jobs(env.client, queue)

    async def start(self, graph: dict[str, Any]) -> WorkflowHandle[Any, Plan]:
        job = VideoJob(job_id=f"fit-{uuid.uuid4().hex[:10]}", graph=graph)
        return await job_ops.submit(self.client, job, self.queue)

    def posted(self, sim: ComfyUISim, plan: Plan) -> int:
        return sim.prompt_posts[plan.prompt_id] if plan.prompt_id else 0


@pytest.fixture
def studio(dev_env: WorkflowEnvironment, gpu: Any, tmp_path: Path) -> Callable[..., Any]:
    @asynccontextmanager
    async def run(**overrides: Any) -> AsyncIterator[Studio]:
        async with two_hosts(dev_env.client, gpu, tmp_path, **overrides) as hosts:
            hosts.b.installed = B_HAS
            yield Studio(dev_env, hosts.queue, hosts.a, hosts.b)

    return run


async def test_a_node_and_a_model_only_one_host_has_run_there_with_the_other_free(studio):
    async with studio() as st:
        plans = [await (await st.start(g)).result() for g in (GRAIN_GRAPH, ON_A_CHECKPOINT)]
        anywhere = await (await st.start(VIDEO_GRAPH)).result()
        hosts = {h.name: h.capabilities for h in (await pool_view(st.client, st.queue)).hosts}
        health = await st.client.execute_workflow(
            HealthWorkflow.run, id=f"health-{uuid.uuid4()}", task_queue=st.queue
        )
    assert [(p.state, p.host) for p in plans] == [("completed", "gpu-b")] * 2
    assert all(st.posted(st.b, p) == 1 and st.posted(st.a, p) == 0 for p in plans)
    assert all("cannot_run_on=gpu-a" in p.reasons for p in plans)
    # `status` says where it can run and what the other host lacks.
    assert (plans[0].can_run, plans[0].cannot_run) == (
        ["gpu-b"],
        {"gpu-a": ["node FilmGrainLite (#3) is not installed"]},
    )
    assert "  hosts     Can run on gpu-b; not on gpu-a: node FilmGrainLite" in render_plan(plans[0])
    # `queue` and `health` show what each host has, in brief, as its agent read it.
    b = hosts["gpu-b"]
    assert b is not None and (b.nodes, b.models) == (len(B_HAS.nodes), {"checkpoints": 1})
    a = hosts["gpu-a"]
    assert a is not None and (a.nodes, a.models) == (len(B_HAS.nodes) - 1, {})
    seen = {h.name: h.capabilities for h in health.hosts}
    assert seen["gpu-b"] is not None and seen["gpu-b"].models == {"checkpoints": 1}
    assert capabilities_brief(b).startswith(f"{len(B_HAS.nodes)} node classes; checkpoints 1 (")
    # A graph both can run takes the first free host, as before.
    assert anywhere.state == "completed" and "cannot_run_on=gpu-a" not in anywhere.reasons


async def test_a_graph_no_host_can_run_fails_before_anything_is_posted_naming_what_each_lacks(
    studio,
):
    async with studio() as st:
        st.b.installed = Host(models=B_HAS.models)  # no host has the custom node now
        handle = await st.start(GRAIN_GRAPH)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
    message = cause_message(failed)
    assert message.startswith("no GPU host can run this graph (gpu-a: node FilmGrainLite (#3)")
    assert "gpu-b: node FilmGrainLite (#3) is not installed" in message
    assert not st.a.prompt_posts and not st.b.prompt_posts


async def test_a_job_whose_only_capable_host_is_full_waits_for_it_while_the_other_is_free(studio):
    async with studio() as st:
        st.b.pause()  # the first job's prompt stays pending on gpu-b: its place stays held
        first = await st.start(GRAIN_GRAPH)
        await st.jobs.until(first, "running_local")
        second = await st.start(GRAIN_GRAPH)
        await st.jobs.until(second, "queued")
        line = (await pool_view(st.client, st.queue)).line
        assert [(i.job_id, i.why) for i in line] == [(second.id, "places taken (gpu-b 1/1)")]
        # Meanwhile a job any host can run takes gpu-a.
        assert (await (await st.start(VIDEO_GRAPH)).result()).host == "gpu-a"
        st.b.resume()
        plans = await asyncio.gather(first.result(), second.result())
    assert [(p.state, p.host) for p in plans] == [("completed", "gpu-b")] * 2
    assert not st.a.prompt_posts.keys() & {p.prompt_id for p in plans}
    assert st.b.most_held == 1


async def test_a_custom_node_installed_and_comfyui_restarted_is_seen_at_once(studio):
    """A ComfyUI restart (how a custom node is installed) is seen by the agent's socket, which
    reconnects: the next job reads what the host can run anew, not at the next refresh."""
    async with studio() as st:
        for _ in range(2):  # the second after the agent's socket is surely up: read, and kept
            first = await (await st.start(GRAIN_GRAPH)).result()
            assert (first.host, "cannot_run_on=gpu-a" in first.reasons) == ("gpu-b", True)
        reads = st.a.hits["GET /object_info"]
        sockets = st.a.hits["GET /ws"]
        st.a.installed = B_HAS  # the custom node and the model, installed on gpu-a too
        await st.a.restart()
        await until(lambda: st.a.hits["GET /ws"] > sockets, what="gpu-a's agent reconnected")
        later = await (await st.start(GRAIN_GRAPH)).result()
    assert later.state == "completed" and "cannot_run_on=gpu-a" not in later.reasons
    assert st.a.hits["GET /object_info"] == reads + 1  # once, for the job after the restart


async def test_a_job_whose_only_capable_host_does_not_answer_waits_for_it_by_today_s_rules(studio):
    """gpu-b's ComfyUI is down: its agent cannot say what it has, so it is not ruled out; the
    job (not armed) waits in line until gpu-b answers again, never taking gpu-a."""
    async with studio() as st:
        await st.b.stop()
        handle = await st.start(GRAIN_GRAPH)
        await st.jobs.until(handle, "queued")
        line = (await pool_view(st.client, st.queue)).line
        assert [(i.job_id, i.why) for i in line] == [(handle.id, "no GPU host answers")]
        await st.b.start()
        plan = await handle.result()
    assert (plan.state, plan.host, plan.can_run) == ("completed", "gpu-b", ["gpu-b"])
    assert not st.a.prompt_posts
