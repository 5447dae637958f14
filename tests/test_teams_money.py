"""A studio of several teams and its money (issue 62, item 4), on the dev server with the route
stubs and the real spend ledger:

- the teams file's budget seeds the team's budget in the ledger; an armed job over its team's
  budget waits, its reasons and words naming that team's budget; `spillway budget --team`
  shows the team's spend and sets its budget with a signed order; `spillway team list --json`
  shows each team's share and what its budget has left.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from spillway.core.ledger import TeamSpend
from tests.support.cli import spillway
from tests.support.constants import CLIP_USD
from tests.support.jobs import RunJobs
from tests.support.route_stubs import BUSY, RouteStubs
from tests.support.settings import ARMED
from tests.support.teams import cli_env_of, start, write_teams
from workflows.texts import current_details


@pytest.fixture
def teams_file(tmp_path: Path) -> Path:
    return write_teams(tmp_path)


async def test_a_teams_budget_is_seeded_from_the_teams_file_and_names_itself_when_out(
    run_dev_jobs: RunJobs, teams_file: Path, cli_env: Any, dev_env: WorkflowEnvironment
):
    stubs = RouteStubs(BUSY)
    async with run_dev_jobs(
        stubs,
        **ARMED,
        APPROVAL_TIMEOUT_S=600,
        CLOUD_DAILY_BUDGET_USD=10 * CLIP_USD,
        SPILLWAY_TEAMS_FILE=teams_file,
    ) as jobs:
        env = cli_env_of(cli_env, dev_env, jobs, teams_file)
        first = await start(jobs, "ads", "ads one")
        assert (await jobs.until(first, "completed")).route == "cloud"
        second = await start(jobs, "ads", "ads two")
        waiting = await jobs.until(second, "awaiting_approval")
        film = await start(jobs, None, "film one")
        assert (await jobs.until(film, "completed")).route == "cloud"

        assert "budget_exhausted" in waiting.reasons
        assert "budget_exhausted_by=team:ads" in waiting.reasons
        assert waiting.budget is not None and waiting.budget.exhausted_team == "ads"
        assert waiting.quote is not None and "team ads's daily cloud budget" in waiting.quote.why
        assert "team ads's cloud budget cannot cover the job" in current_details(waiting)

        code, out, err = await spillway("budget", "--team", "ads", "--json", env=env)
        assert code == 0, err
        ads = TeamSpend.model_validate_json(out)
        assert ads.day.budget_usd == pytest.approx(CLIP_USD)
        assert ads.day.spent_usd == pytest.approx(CLIP_USD) and ads.day.remaining_usd == 0
        assert ads.budget_set is not None and ads.budget_set.seed

        code, out, err = await spillway(
            "budget", "--team", "ads", "--day", str(3 * CLIP_USD), "--by", "ana", "--json", env=env
        )
        assert code == 0, err
        ads = TeamSpend.model_validate_json(out)
        assert ads.day.budget_usd == pytest.approx(3 * CLIP_USD)
        assert ads.budget_set is not None and ads.budget_set.by == "ana"

        code, out, err = await spillway("budget", "--json", env=env)
        assert code == 0, err
        studio = json.loads(out)
        assert studio["day"]["budget_usd"] == pytest.approx(10 * CLIP_USD)  # not the team's
        assert studio["day"]["spent_usd"] == pytest.approx(2 * CLIP_USD)

        code, out, err = await spillway("team", "list", "--json", env=env)
        assert code == 0, err
        rows = {row["team"]: row for row in json.loads(out)}
        assert set(rows["ads"]) == {"team", "share", "places_held", "waiting", "budget"}
        assert rows["film"]["share"] == 2 and rows["film"]["budget"] is None
        assert rows["ads"]["budget"]["day_left_usd"] == pytest.approx(2 * CLIP_USD)
        assert rows["ads"]["budget"]["month_left_usd"] is None

        code, _, err = await spillway("budget", "--team", "games", env=env)
        assert code == 2 and "no team 'games'" in err
    assert stubs.creates == 2
