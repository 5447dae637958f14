"""`spillway submit|quote|list --team` against the real dev server, the workers and the command
reading one teams file (docs/jobs.md, "Teams"): a job's team in `status`, in the search attribute
`SpillwayTeam` and in lists; an unknown team refused before anything starts; a job that names a
team the workers do not know, started around the command, ending failed with the teams named."""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowFailureError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from spillway.cli.render import render_plan, render_queue
from spillway.client import jobs as job_ops
from spillway.core import names
from spillway.core import search_attributes as sa
from spillway.core.errors import Failed
from spillway.core.gpu_pool import HostPlaces, InLine, PlaceView, PoolView
from spillway.core.models import Plan, Quote, VideoJob
from spillway.core.teams import STUDIO
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.cli import one_line, spillway
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import RunJobs, cause_message
from tests.support.one_host import one_host
from tests.support.route_stubs import FREE, RouteStubs
from tests.support.waiting import until
from tests.test_any_client import _publications_before_the_probe

TEAMS = {"default": "film", "teams": {"film": {"share": 2}, "ads": {"share": 1}}}
THE_TEAMS = "the teams: ads, film"


@pytest.fixture
def teams_file(tmp_path: Path) -> Path:
    path = tmp_path / "teams.json"
    path.write_text(json.dumps(TEAMS))
    return path


@pytest.fixture
def graph_file(tmp_path: Path) -> Path:
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(VIDEO_GRAPH))
    return path


@pytest.fixture
def team_env(cli_env, dev_env: WorkflowEnvironment, teams_file: Path) -> Callable[..., Any]:
    """The command's environment: the dev server, the queue, and the workers' teams file."""

    def make(task_queue: str | None = None, **extra: str) -> dict[str, str]:
        env: dict[str, str] = cli_env(
            TEMPORAL_ADDRESS=dev_env.client.service_client.config.target_host,
            SPILLWAY_TASK_QUEUE=task_queue or f"nobody-{uuid.uuid4()}",
            SPILLWAY_TEAMS_FILE=str(teams_file),
            **extra,
        )
        return env

    return make


def new_id() -> str:
    return f"team-{uuid.uuid4().hex[:10]}"


async def listed(env: dict[str, str], *args: str) -> set[str]:
    code, out, err = await spillway("list", *args, "--json", env=env)
    assert code == 0, err
    return {j["job_id"] for j in json.loads(out)}


async def test_a_job_s_team_is_in_its_status_its_search_attribute_and_list_team(
    run_dev_jobs: RunJobs, team_env, teams_file, graph_file
):
    ads, film, before = new_id(), new_id(), new_id()
    async with run_dev_jobs(RouteStubs(FREE), SPILLWAY_TEAMS_FILE=str(teams_file)) as jobs:
        env = team_env(jobs.task_queue)
        for job_id, team in ((ads, ["--team", "ads"]), (film, [])):
            code, _, err = await spillway(
                "submit", "--graph", str(graph_file), "--job-id", job_id, *team, "--wait",
                env=env,
            )  # fmt: skip
            assert code == 0, err
        # A job from before the teams file: no team, no search attribute.
        old = await job_ops.submit(
            jobs.client, VideoJob(job_id=before, graph=VIDEO_GRAPH), jobs.task_queue
        )
        await old.result()
        statuses = {}
        for job_id in (ads, film, before):
            code, out, err = await spillway("status", job_id, "--json", env=env)
            assert code == 0, err
            statuses[job_id] = json.loads(out)
        code, text, _ = await spillway("status", ads, env=env)
        described = {
            job_id: await jobs.client.get_workflow_handle(job_id).describe()
            for job_id in (ads, film, before)
        }
        ads_jobs = await until(lambda: listed(env, "--team", "ads"), lambda ids: ads in ids)
        film_jobs = await until(
            lambda: listed(env, "--team", "film"), lambda ids: {film, before} <= ids
        )
    assert {job_id: s["team"] for job_id, s in statuses.items()} == {
        ads: "ads",
        film: "film",  # the file's default
        before: "film",  # no team: the workers' default
    }
    assert all(s["state"] == "completed" for s in statuses.values())
    assert "  team      ads" in text
    attributes = {job_id: d.typed_search_attributes.get(sa.TEAM) for job_id, d in described.items()}
    assert attributes == {ads: "ads", film: "film", before: None}
    assert ads not in film_jobs and {film, before}.isdisjoint(ads_jobs)


async def test_an_unknown_team_is_exit_2_naming_the_teams_and_starts_nothing(
    team_env, dev_env: WorkflowEnvironment, graph_file, teams_file
):
    job_id = new_id()
    env = team_env()
    code, out, err = await spillway(
        "submit", "--graph", str(graph_file), "--job-id", job_id, "--team", "adz", env=env
    )
    assert (code, out) == (2, "")
    assert f"no team 'adz'; {THE_TEAMS} (the teams file {teams_file})" in one_line(err)
    with pytest.raises(RPCError, match="not found"):
        await dev_env.client.get_workflow_handle(job_id).describe()


async def test_a_job_started_around_the_command_with_an_unknown_team_fails_naming_the_teams(
    run_dev_jobs: RunJobs, team_env, teams_file
):
    job_id, stubs = new_id(), RouteStubs(FREE)
    async with run_dev_jobs(stubs, SPILLWAY_TEAMS_FILE=str(teams_file)) as jobs:
        job = VideoJob(job_id=job_id, graph=VIDEO_GRAPH, team="adz")
        handle = await job_ops.submit(jobs.client, job, jobs.task_queue)
        with pytest.raises(WorkflowFailureError) as failed:
            await handle.result()
        code, out, err = await spillway("status", job_id, "--json", env=team_env(jobs.task_queue))
    assert f"no team 'adz'; {THE_TEAMS}" in cause_message(failed)
    assert code == 0, err
    status = json.loads(out)
    assert status["state"] == "failed" and f"no team 'adz'; {THE_TEAMS}" in status["error"]
    assert stubs.calls[names.COMFYUI_SUBMIT] == 0  # it never reached a host


async def test_quote_takes_the_team_and_the_workers_refuse_one_they_do_not_know(
    dev_env: WorkflowEnvironment,
    comfyui: ComfyUISim,
    minimax: MiniMaxSim,
    gpu: Any,
    tmp_path: Path,
    team_env,
    teams_file,
    graph_file,
):
    async with one_host(
        dev_env.client, comfyui, minimax, gpu, tmp_path, SPILLWAY_TEAMS_FILE=str(teams_file)
    ) as settings:
        queue = settings.SPILLWAY_TASK_QUEUE
        env = team_env(queue)
        code, out, err = await spillway(
            "quote", "--graph", str(graph_file), "--team", "ads", "--json", env=env
        )
        assert code == 0, err
        quote = Quote.model_validate(json.loads(out))
        code, _, err = await spillway("quote", "--graph", str(graph_file), "--team", "adz", env=env)
        assert code == 2 and f"no team 'adz'; {THE_TEAMS}" in one_line(err)
        # Around the command, the workers' own check: what the job would fail with.
        job = VideoJob(job_id="quote", graph=VIDEO_GRAPH, team="adz")
        with pytest.raises(Failed, match=f"no team 'adz'; {THE_TEAMS}"):
            await job_ops.quote(dev_env.client, queue, job)
    assert (quote.route, quote.local.position) == ("local", 0)


def test_status_and_queue_name_a_team_only_where_there_are_teams():
    since = datetime(2026, 12, 6, 21, 0, tzinfo=UTC)

    def view(team: str) -> PoolView:
        place = PlaceView(job_id="held-1", since=since, state="running_local", team=team)
        waiting = InLine(
            job_id="waits-1", priority=3, since=since, mode="any", position=1, eta_s=None,
            why="every place taken", team=team,
        )  # fmt: skip
        host = HostPlaces(name="a40", max_jobs=1, places=[place], reachable=True, headroom=True)
        return PoolView(hosts=[host], line=[waiting])

    shown = render_queue(view("ads"))
    assert "since 21:00:00  team ads" in shown and "team ads; every place taken" in shown
    assert "team" not in render_queue(view(STUDIO))
    assert "  team      ads" in render_plan(Plan(job_id="j", team="ads")).splitlines()
    assert "team" not in render_plan(Plan(job_id="j", team=STUDIO))
    assert "team" not in render_plan(Plan(job_id="j"))  # a job from before teams


async def test_a_team_on_the_start_costs_the_job_no_publication_of_its_own(run_jobs: RunJobs):
    """The team rides on the start beside the first publication, which the job then skips as
    for any job of spillway's client: no upsert before its first activity."""
    async with run_jobs(RouteStubs(FREE)) as jobs:
        job = VideoJob(job_id=new_id(), graph=VIDEO_GRAPH, team=STUDIO)
        handle = await job_ops.submit(jobs.client, job, jobs.task_queue)
        plan = await handle.result()
        described = await handle.describe()
        upserts = await _publications_before_the_probe(handle)
    assert (plan.state, plan.team) == ("completed", STUDIO)
    assert described.typed_search_attributes.get(sa.TEAM) == STUDIO and upserts == 0
