"""A studio of two teams for the tests of issue 62: `film` (the default, share 2) and `ads`
(a budget of one clip a day, approvers ana and ben), and jobs started for a team."""

from __future__ import annotations

import json
import uuid
from pathlib import Path
from typing import Any

from temporalio.testing import WorkflowEnvironment

from spillway.client import jobs as job_ops
from spillway.core.models import CloudRequest, VideoJob
from tests.support.constants import CLIP_USD, LEDGER_SECRET
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import Jobs

TEAMS = {
    "default": "film",
    "teams": {
        "film": {"share": 2},
        "ads": {
            "share": 1,
            "budget": {"day_usd": CLIP_USD},
            "approvers": ["ana", "ben"],
        },
    },
}


def write_teams(folder: Path) -> Path:
    path = folder / "teams.json"
    path.write_text(json.dumps(TEAMS))
    return path


async def start(jobs: Jobs, team: str | None, prompt: str = "a teams job") -> str:
    job = VideoJob(
        job_id=f"team-{uuid.uuid4().hex[:10]}",
        graph=VIDEO_GRAPH,
        cloud=CloudRequest(prompt=prompt),
        team=team,
    )
    await job_ops.submit(jobs.client, job, jobs.task_queue)
    return job.job_id


def cli_env_of(
    cli_env: Any, dev_env: WorkflowEnvironment, jobs: Jobs, teams: Path
) -> dict[str, str]:
    address = dev_env.client.service_client.config.target_host
    env: dict[str, str] = cli_env(
        TEMPORAL_ADDRESS=address,
        SPILLWAY_TASK_QUEUE=jobs.task_queue,
        SPILLWAY_TEAMS_FILE=str(teams),
        SPILLWAY_LEDGER_SECRET=LEDGER_SECRET,
    )
    return env
