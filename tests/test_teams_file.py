"""The teams file (SPILLWAY_TEAMS_FILE; docs/jobs.md, "Teams"): a bad one stops the worker at
start, and every command that reads it, in one line naming the field (exit 2); a team it does
not name is refused before anything starts; without a file there is one team, `studio`, and a
job that names none starts as it always has."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import worker
from spillway.client.new_jobs import make_job, with_team
from spillway.core.errors import ConfigError
from spillway.core.teams import STUDIO, load_teams
from tests.support.cli import one_line, spillway
from tests.support.graphs import VIDEO_GRAPH
from tests.support.settings import make_settings

TEAMS: dict[str, object] = {"default": "film", "teams": {"film": {"share": 2}, "ads": {"share": 1}}}
# Nothing answers here: a command that got as far as Temporal would exit 1, not 2.
NOBODY = "127.0.0.1:9"

BAD_FILES = [
    pytest.param('{"default": "film", "teams": {', "Invalid JSON", id="not-json"),
    pytest.param(
        {"default": "film", "teams": {"film": {"shares": 2}}},
        "teams.film.shares: Extra inputs are not permitted",
        id="unknown-field",
    ),
    pytest.param(
        {"default": "film", "teams": {"film": {"share": 0}}},
        "teams.film.share: Input should be greater than 0",
        id="share-0",
    ),
    pytest.param(
        {"default": "tv", "teams": {"film": {}, "ads": {}}},
        "default: 'tv' is not one of the teams (film, ads)",
        id="default-not-a-team",
    ),
    pytest.param(
        {"default": "film", "teams": {"film": {}, "ads team": {}}},
        "teams.ads team.[key]: String should match pattern",
        id="bad-team-name",
    ),
]


def write(tmp_path: Path, content: str | dict[str, object]) -> Path:
    path = tmp_path / "teams.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    return path


@pytest.mark.parametrize(("content", "named"), BAD_FILES)
def test_a_bad_teams_file_is_refused_in_one_line_naming_the_field(tmp_path, content, named):
    path = write(tmp_path, content)
    with pytest.raises(ConfigError) as raised:
        load_teams(path)
    message = str(raised.value)
    assert named in message and f"teams file {path}" in message and "\n" not in message


def test_a_missing_teams_file_says_which():
    with pytest.raises(ConfigError, match=r"cannot read teams file /nowhere/teams\.json"):
        load_teams(Path("/nowhere/teams.json"))


@pytest.mark.parametrize(("content", "named"), BAD_FILES)
async def test_a_worker_with_a_bad_teams_file_exits_2_in_one_line_naming_the_field(
    monkeypatch: pytest.MonkeyPatch, cli_env, capsys, tmp_path, content, named
):
    for name in set(os.environ) - set(cli_env()):
        monkeypatch.delenv(name)
    monkeypatch.setenv("SPILLWAY_TEAMS_FILE", str(write(tmp_path, content)))
    monkeypatch.setenv("TEMPORAL_ADDRESS", NOBODY)
    assert await worker.main() == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("spillway worker: invalid teams file ") and named in err


@pytest.mark.parametrize(("content", "named"), BAD_FILES)
async def test_the_commands_that_read_the_teams_file_exit_2_naming_the_field(
    cli_env, tmp_path, content, named
):
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps(VIDEO_GRAPH))
    env = cli_env(SPILLWAY_TEAMS_FILE=str(write(tmp_path, content)), TEMPORAL_ADDRESS=NOBODY)
    for args in (
        ["submit", "--graph", str(graph)],
        ["submit", "--graph", str(graph), "--team", "film"],
        ["quote", "--graph", str(graph), "--team", "film"],
        ["list", "--team", "film"],
    ):
        code, out, err = await spillway(*args, env=env)
        assert (code, out) == (2, ""), (args, err)
        assert named in one_line(err) and "invalid teams file" in err, args


async def test_a_team_the_file_does_not_name_is_exit_2_naming_the_teams(cli_env, tmp_path):
    graph = tmp_path / "graph.json"
    graph.write_text(json.dumps(VIDEO_GRAPH))
    path = write(tmp_path, TEAMS)
    for args in (["submit"], ["quote"]):
        env = cli_env(SPILLWAY_TEAMS_FILE=str(path), TEMPORAL_ADDRESS=NOBODY)
        code, _, err = await spillway(*args, "--graph", str(graph), "--team", "adz", env=env)
        assert code == 2
        assert f"no team 'adz'; the teams: ads, film (the teams file {path})" in one_line(err)
        # Without a file the one team is studio, and the command says where it looked.
        code, _, err = await spillway(
            *args, "--graph", str(graph), "--team", "ads", env=cli_env(TEMPORAL_ADDRESS=NOBODY)
        )
        assert code == 2
        assert "no team 'ads'; the teams: studio (SPILLWAY_TEAMS_FILE is not set here)" in err
    code, _, err = await spillway(
        "list", "--team", "adz", env=cli_env(SPILLWAY_TEAMS_FILE=str(path), TEMPORAL_ADDRESS=NOBODY)
    )
    assert code == 2 and "no team 'adz'" in one_line(err)


def test_a_job_without_a_team_is_the_default_team_s_and_without_a_file_stays_as_it_was(
    tmp_path,
):
    job = make_job(VIDEO_GRAPH, job_id="job-1")
    assert job.team is None
    assert with_team(job, make_settings()).team is None  # nothing new on the wire without a file
    assert with_team(make_job(VIDEO_GRAPH, team=STUDIO), make_settings()).team == STUDIO
    teams = make_settings(SPILLWAY_TEAMS_FILE=write(tmp_path, TEAMS))
    assert with_team(job, teams).team == "film"
    assert with_team(make_job(VIDEO_GRAPH, team="ads"), teams).team == "ads"


def test_a_team_name_that_could_never_be_a_team_is_refused_when_the_job_is_made():
    with pytest.raises(ConfigError, match="team: String should match pattern"):
        make_job(VIDEO_GRAPH, team="ads'; drop")


def test_an_empty_setting_is_no_teams_file_as_compose_s_env_has_it():
    assert make_settings(SPILLWAY_TEAMS_FILE="").SPILLWAY_TEAMS_FILE is None
