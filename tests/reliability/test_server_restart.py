"""Scenario 2: the Temporal dev server stopped (SIGTERM) and started again on the same SQLite file
while 50 jobs are in every state a job can be in, with the worker processes left running: after
the restart `spillway list` shows the same jobs in the same states, and every one of them
finishes once the people and machines it waits for act.

The 50 jobs, all on real worker processes against the doubles:
- 10 completed and 8 failed (ComfyUI rejected their graph) before the restart;
- 8 running_local (ComfyUI paused: their prompts sit in its queue);
- 8 running_cloud (approved; MiniMax keeps answering "Processing");
- 8 awaiting_approval (the A40 overloaded, the fallback not armed);
- 8 queued (their ComfyUI down past the approval window: they wait in the GPU line for it to
  come back).
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from pathlib import Path
from typing import Any

import httpx
import pytest

from spillway.client import jobs as job_ops
from spillway.core.models import ApprovalDecision, JobState, Plan
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import QUERY_PATH, MiniMaxSim
from tests.reliability.harness import DevServer, Sightings, api_texts, cli, history_text, posts_of
from tests.support.constants import BUSY_VRAM_PCT, FREE_VRAM_PCT
from tests.support.graphs import VIDEO_GRAPH, graph_without
from tests.support.jobs import Jobs
from tests.support.waiting import until

# Each wait's deadline: 50 jobs, two workers and the server on two cores, which the load check
# shares with two busy processes (a job took over 60 s from its start to `failed` there).
PATIENCE_S = 300
BEFORE = {
    "completed": 10,
    "failed": 8,
    "running_local": 8,
    "running_cloud": 8,
    "awaiting_approval": 8,
    "queued": 8,
}
# What MiniMax answers while a task renders: the approved jobs stay running_cloud meanwhile.
STILL_PROCESSING = {
    "task_id": "",
    "status": "Processing",
    "base_resp": {"status_code": 0, "status_msg": "success"},
}


@pytest.mark.timeout(1200)  # a backstop: each wait has its own deadline
async def test_a_dev_server_restart_keeps_fifty_jobs_in_every_state_and_all_of_them_finish(
    tmp_path: Path, workers, comfyui: ComfyUISim, minimax: MiniMaxSim, sightings: Sightings
):
    server = DevServer(tmp_path / "restart.db", ui=False)
    await server.start()
    try:
        await _scenario(server, workers, comfyui, minimax, sightings)
    finally:
        await server.stop()


async def _scenario(
    server: DevServer,
    workers: Any,
    comfyui: ComfyUISim,
    minimax: MiniMaxSim,
    sightings: Sightings,
) -> None:
    comfyui.execution_s = 0.02
    # Eight places: the eight running_local prompts sit in ComfyUI's queue together.
    local = await workers(
        server,
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        APPROVAL_TIMEOUT_S=600,
        A40_MAX_JOBS=8,
    )
    async with ComfyUISim() as gone:
        gone.set_vram_used_pct(FREE_VRAM_PCT)
        gone.execution_s = 0.02
        await gone.stop()  # refuses connections on its port until started again
        waiting = await workers(server, COMFYUI_URL=gone.url, APPROVAL_TIMEOUT_S=1)
        on_local = Jobs(server.client, local.task_queue)
        on_waiting = Jobs(server.client, waiting.task_queue)
        by_state: dict[str, list[str]] = {}

        async def put(state: JobState, jobs: Jobs, n: int, **submit: Any) -> None:
            ids = [await jobs.submit(**submit) for _ in range(n)]
            await asyncio.gather(*(jobs.until(j, state, PATIENCE_S) for j in ids))
            by_state[state] = ids

        await asyncio.gather(
            put("completed", on_local, 10),
            put("failed", on_local, 8, graph=graph_without(VIDEO_GRAPH, "2", "fps")),
            put("queued", on_waiting, 8),
        )
        comfyui.pause()
        await put("running_local", on_local, 8)
        posted = by_state["running_local"]
        await until(
            lambda: posts_of(comfyui, posted) == dict.fromkeys(posted, 1), timeout_s=PATIENCE_S
        )
        comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
        await put("awaiting_approval", on_local, 16)
        minimax.answers[QUERY_PATH] = STILL_PROCESSING
        by_state["running_cloud"] = by_state["awaiting_approval"][8:]
        by_state["awaiting_approval"] = by_state["awaiting_approval"][:8]
        approval = ApprovalDecision(approved=True, by="owner", reason="before the restart")
        for job_id in by_state["running_cloud"]:
            await job_ops.decide(server.client, job_id, approval)
        # Each create answered and its task id kept (a create cut off by the outage would be
        # ambiguous, and rightly fail its job).
        await asyncio.gather(
            *(on_local.until(j, _has_task, PATIENCE_S) for j in by_state["running_cloud"])
        )
        assert minimax.tasks_created == 8

        env = local.env
        before = await _listed(sightings, env, expected=BEFORE)
        statuses = {j: (await on_local.status(j)).state for j in before}
        assert statuses == before
        assert {s: len(ids) for s, ids in by_state.items()} == BEFORE

        await server.stop()
        await asyncio.sleep(1)  # the workers keep trying to reach it meanwhile
        await server.start()
        on_local.client = on_waiting.client = server.client

        after = await _listed(sightings, env)
        assert after == before
        assert {j: (await on_local.status(j)).state for j in after} == before
        assert local.running and waiting.running

        # Everyone acts: two people decide, ComfyUI and MiniMax go on, the other ComfyUI returns.
        to_approve, to_reject = by_state["awaiting_approval"][:4], by_state["awaiting_approval"][4:]
        decisions = [
            cli(sightings, "approve", j, "--by", "owner", "--reason", "after restart", env=env)
            for j in to_approve
        ] + [cli(sightings, "reject", j, "--by", "owner", env=env) for j in to_reject]
        for code, out, err in await asyncio.gather(*decisions):
            assert code == 0, out + err
        comfyui.resume()
        del minimax.answers[QUERY_PATH]
        await gone.start()

        final = dict(
            zip(
                before,
                await asyncio.gather(*(on_local.finished(j, PATIENCE_S) for j in before)),
                strict=True,
            )
        )
        async with httpx.AsyncClient() as http:
            for job_id in before:
                sightings.add(f"history: {job_id}", await history_text(server.client, job_id))
                sightings.add(
                    f"ui api: {job_id} (the HTTP API of the restarted server)",
                    await api_texts(http, server.api(ui=False), job_id),
                )

    def outcome(plan: Plan) -> tuple[str, str | None]:
        return plan.state, plan.route

    # By the state each job was in before the restart; those awaiting approval by the decision.
    groups = {s: ids for s, ids in by_state.items() if s != "awaiting_approval"}
    groups |= {"approved": to_approve, "rejected": to_reject}
    assert {group: {outcome(final[j]) for j in ids} for group, ids in groups.items()} == {
        "completed": {("completed", "local")},
        "failed": {("failed", "local")},
        "running_local": {("completed", "local")},
        "running_cloud": {("completed", "cloud")},
        "queued": {("completed", "local")},
        "approved": {("completed", "cloud")},
        "rejected": {("completed", "local")},
    }

    cloud = set(by_state["running_cloud"] + to_approve)
    local_jobs = [j for j in before if j not in cloud]
    assert posts_of(comfyui, local_jobs) | posts_of(gone, by_state["queued"]) == dict.fromkeys(
        local_jobs, 1
    )
    assert sum(comfyui.prompt_posts.values()) + sum(gone.prompt_posts.values()) == 38
    assert minimax.create_calls == minimax.tasks_created == len(cloud) == 12
    assert {j: final[j].cloud is not None for j in before} == {j: j in cloud for j in before}


def _has_task(plan: Plan) -> bool:
    return plan.state == "running_cloud" and plan.cloud is not None and bool(plan.cloud.task_id)


async def _listed(
    sightings: Sightings, env: dict[str, str], expected: dict[str, int] | None = None
) -> dict[str, str]:
    """`spillway list --json` as {job: state}; with `expected`, until visibility shows those
    counts (it follows the jobs' own state by a moment)."""

    async def listed() -> dict[str, str]:
        code, out, err = await cli(sightings, "list", "--json", env=env)
        assert code == 0, err
        return {j["job_id"]: j["state"] for j in json.loads(out)}

    def shows(jobs: dict[str, str]) -> bool:
        return expected is None or Counter(jobs.values()) == Counter(expected)

    what = f"spillway list to show {expected}"
    return await until(listed, shows, timeout_s=PATIENCE_S, every_s=0.2, what=what)
