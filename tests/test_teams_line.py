"""Teams in the GPU line end to end (docs/design.md, "A studio of several teams"): the worker and
its agent on the real dev server, the ComfyUI double as the one host. A team's waiting limit
holds under a burst: the pool refuses what the CLI could not see."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.cli import spillway as cli
from tests.support.gpu_line import (
    posted,
    sampling,
    spillway_fixture,  # noqa: F401  (the `spillway` fixture)
)
from tests.support.graphs import VIDEO_GRAPH
from tests.support.waiting import until

pytestmark = pytest.mark.full

WORDS = "team ads has 10 jobs waiting, its limit (max_waiting)"


async def test_a_burst_of_50_submits_against_a_waiting_limit_of_10_never_lines_more_than_10(
    spillway, comfyui: ComfyUISim, minimax: MiniMaxSim, tmp_path: Path, cli_env, dev_env
):
    teams = tmp_path / "teams.json"
    teams.write_text(
        json.dumps({"default": "ads", "teams": {"ads": {"max_waiting": 10}, "film": {}}})
    )
    comfyui.execution_s = 0.2
    comfyui.pause()  # the two admitted stay pending in ComfyUI: the line holds still
    async with (
        spillway(SPILLWAY_TEAMS_FILE=str(teams)) as sw,
        sampling(comfyui) as sampler,
    ):
        most_waiting = 0

        async def watch_the_line() -> None:
            nonlocal most_waiting
            while True:
                view = await sw.view()
                most_waiting = max(most_waiting, sum(i.team == "ads" for i in view.line))
                await asyncio.sleep(0.02)

        watcher = asyncio.create_task(watch_the_line())
        # Started as a client would, around the CLI's check: all 50 race for the line.
        handles = await asyncio.gather(*(sw.start(cloud=False, team="ads") for _ in range(50)))
        film = await sw.start(cloud=False, team="film")

        async def settled() -> int:
            plans = [await sw.jobs.status(h) for h in handles]
            return sum(p.state in ("failed", "queued", "running_local") for p in plans)

        await until(settled, lambda n: n == 50, timeout_s=180, what="every job placed or refused")
        await sw.line_is(lambda line: film.id in line)
        view = await sw.view()
        assert sum(i.team == "ads" for i in view.line) == 10
        assert [i.team for i in view.line].count("film") == 1
        # The CLI sees the 10 waiting: exit 1 naming the team and its limit, nothing started.
        env = cli_env(
            TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
            SPILLWAY_TASK_QUEUE=sw.queue,
            SPILLWAY_TEAMS_FILE=str(teams),
        )
        graph = tmp_path / "graph.json"
        graph.write_text(json.dumps(VIDEO_GRAPH))
        code, out, err = await cli("submit", "--graph", str(graph), "--job-id", "over", env=env)
        assert code == 1 and out == "" and WORDS in err, err
        assert [j async for j in sw.client.list_workflows("WorkflowId = 'over'")] == []
        comfyui.resume()
        plans = [
            await sw.jobs.until(h, lambda p: p.state in ("completed", "failed"), timeout_s=120)
            for h in [*handles, film]
        ]
        watcher.cancel()
    done = [p for p in plans if p.state == "completed"]
    refused = [p for p in plans if p.state == "failed"]
    assert most_waiting == 10
    assert len(done) == 13 and len(refused) == 38  # 2 places, 10 waiting, and film's one
    assert all(p.error == WORDS for p in refused)
    assert all(posted(comfyui, p) == 0 for p in refused)
    assert all(posted(comfyui, p) == 1 for p in done)
    assert sampler.most <= 2
    assert sum(minimax.create_calls_by_prompt.values()) == 0
