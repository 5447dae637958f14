"""A team's approvers (issue 62, item 5), on the dev server with the route stubs and the real
spend ledger: an approval by someone the job's team does not list as an approver is refused
wherever it comes from (the CLI exits 1, the UI's signal), recorded in the job's ignored
decisions, and the job keeps waiting; one of its approvers then sends it to the cloud; a team
without `approvers` takes anyone's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from temporalio.testing import WorkflowEnvironment

from spillway.client import jobs as job_ops
from spillway.core.errors import Failed
from spillway.core.models import ApprovalDecision, Plan
from spillway.core.names import APPROVAL_SIGNAL
from tests.support.cli import spillway
from tests.support.jobs import RunJobs
from tests.support.route_stubs import BUSY, RouteStubs
from tests.support.settings import KEY
from tests.support.teams import cli_env_of, start, write_teams
from tests.support.waiting import until


@pytest.fixture
def teams_file(tmp_path: Path) -> Path:
    return write_teams(tmp_path)


async def test_an_approval_by_someone_the_team_does_not_list_is_refused_and_the_job_waits(
    run_dev_jobs: RunJobs, teams_file: Path, cli_env: Any, dev_env: WorkflowEnvironment
):
    stubs = RouteStubs(BUSY)
    async with run_dev_jobs(
        stubs, **KEY, APPROVAL_TIMEOUT_S=600, SPILLWAY_TEAMS_FILE=teams_file
    ) as jobs:
        ads, film = await start(jobs, "ads"), await start(jobs, None)
        await jobs.until(ads, "awaiting_approval")
        await jobs.until(film, "awaiting_approval")
        env = cli_env_of(cli_env, dev_env, jobs, teams_file)

        code, _, err = await spillway("approve", ads, "--by", "eve", env=env)
        assert code == 1, err
        assert "eve is not an approver of team ads" in err and "ana, ben" in err
        handle = jobs.client.get_workflow_handle(ads)
        await handle.signal(APPROVAL_SIGNAL, ApprovalDecision(approved=True, by="mallory"))
        plan: Plan = await until(lambda: jobs.status(ads), lambda p: len(p.ignored_signals) == 2)
        assert plan.state == "awaiting_approval" and plan.approval is None
        assert [i.by for i in plan.ignored_signals] == ["eve", "mallory"]
        assert all("not an approver of team ads" in i.why for i in plan.ignored_signals)
        assert stubs.creates == 0

        answer = await job_ops.decide(
            jobs.client, ads, ApprovalDecision(approved=True, by="ana", reason="deadline")
        )
        assert answer.startswith("approved")
        # A team that lists no approvers takes anyone's, as before teams.
        await job_ops.decide(jobs.client, film, ApprovalDecision(approved=True, by="eve"))
        done = await jobs.until(ads, "completed")
        assert (await jobs.until(film, "completed")).route == "cloud"
    assert done.route == "cloud" and done.approval is not None and done.approval.by == "ana"
    assert stubs.creates == 2
    with pytest.raises(Failed):  # the job has moved on: nothing more to approve
        await job_ops.decide(jobs.client, ads, ApprovalDecision(approved=True, by="ben"))
