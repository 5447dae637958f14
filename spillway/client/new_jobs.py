"""A job and a decision, made and checked before anything is sent (SpillwayClient's
`make_job` and `make_decision`, which the `spillway` command uses too), and a decision signed
for its job when this machine has SPILLWAY_APPROVAL_SECRET (`signed_for`)."""

from __future__ import annotations

import os
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from spillway.client import jobs
from spillway.core import approvals
from spillway.core.errors import ConfigError
from spillway.core.models import ApprovalDecision, VideoJob
from spillway.core.settings import Settings, describe_validation_error
from spillway.core.teams import Teams, load_teams


def make_job(
    graph: dict[str, Any] | Path,
    *,
    job_id: str | None = None,
    prompt: str | None = None,
    model: str | None = None,
    duration: int | None = None,
    resolution: str | None = None,
    callback_url: str | None = None,
    priority: int = 3,
    max_wait: str | float | None = None,
    deadline: str | datetime | None = None,
    team: str | None = None,
) -> VideoJob:
    """A job, every part checked (ConfigError naming what is wrong); nothing is started.

    `graph`: an API-format ComfyUI graph (ComfyUI's "Export (API)"), a dict or a JSON file, at
    most 1.5 MB. `prompt` (with `model`, `duration`, `resolution`, checked against what MiniMax
    accepts) is what the cloud renders if the job goes there; without it the job runs only
    locally. `job_id` defaults to `job-<UTC time>-<random>`. `callback_url`: the job's
    job.completed|failed|cancelled POST goes there instead of the workers' JOB_WEBHOOK_URL, not
    signed with the workers' JOB_WEBHOOK_SECRET; it travels in the job's input and so in its
    history: a URL that holds a secret belongs in JOB_WEBHOOK_URL on the workers. `priority`: 1
    (first) to 5 (last), default 3. `max_wait` (seconds, or `90s`, `10m`, `2h`) or `deadline`
    (ISO 8601 with a zone): the job's patience, how long an armed job may wait in the GPU line
    before the cloud. `team`: who the job is for (SPILLWAY_TEAMS_FILE), checked against the
    teams file when the job starts (`with_team`); None: the default team.
    """
    if isinstance(graph, Path):
        graph = jobs.read_graph(graph)
    else:
        jobs.check_graph_size(graph)
    options = {"model": model, "duration": duration, "resolution": resolution}
    return jobs.build_job(
        job_id or new_job_id(),
        graph,
        prompt,
        {k: v for k, v in options.items() if v is not None},
        callback_url=callback_url,
        priority=priority,
        max_wait_s=None if max_wait is None else duration_s(max_wait),
        deadline=None if deadline is None else future(moment(deadline), deadline),
        team=team,
    )


def with_team(job: VideoJob, settings: Settings) -> VideoJob:
    """`job` with its team checked against the teams file this machine reads (the workers
    must read the same one), the default team's name filled in when it names none. ConfigError
    for an unknown team (naming the teams) or a bad file (naming the field). Without a teams
    file a job that names no team stays as it is: one team, and nothing new to register."""
    if settings.SPILLWAY_TEAMS_FILE is None and job.team is None:
        return job
    team, _ = known_team(job.team, settings)
    return job if team == job.team else job.model_copy(update={"team": team})


def known_team(name: str | None, settings: Settings) -> tuple[str, Teams]:
    """The team `name` (None: the default) and the teams, from the teams file this machine
    reads; ConfigError for a bad file or a team it does not name."""
    path = settings.SPILLWAY_TEAMS_FILE
    teams = load_teams(path)
    try:
        return teams.team_of(name), teams
    except ConfigError as exc:
        where = f"the teams file {path}" if path else "SPILLWAY_TEAMS_FILE is not set here"
        raise ConfigError(f"{exc} ({where})") from None


def duration_s(value: str | float) -> float:
    """`90`, `90s`, `10m`, `2h` in seconds; ConfigError for anything else."""
    if isinstance(value, int | float):
        return float(value)
    text = value.strip().lower()
    unit = {"s": 1, "m": 60, "h": 3600}.get(text[-1:])
    number = text[:-1] if unit else text
    try:
        seconds = float(number) * (unit or 1)
    except ValueError:
        raise ConfigError(f"--max-wait {value!r}: give seconds, or 90s, 10m, 2h") from None
    if seconds < 0:
        raise ConfigError(
            f"--max-wait {value!r}: durations are never negative: give 0 (the cloud at once, "
            "when armed) or more, e.g. 90s, 10m, 2h"
        )
    return seconds


def moment(value: str | datetime) -> datetime:
    """An ISO 8601 time with its zone; ConfigError naming what is wrong."""
    if isinstance(value, datetime):
        when = value
    else:
        try:
            when = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            raise ConfigError(
                f"--deadline {value!r}: give an ISO 8601 time, e.g. 2026-12-05T18:00:00Z"
            ) from None
    if when.tzinfo is None:
        raise ConfigError(f"--deadline {value!r}: give its zone, e.g. 2026-12-05T18:00:00Z")
    return when


def future(when: datetime, given: str | datetime) -> datetime:
    """A deadline that has passed would send an armed job to the cloud at once, as if it had
    waited: refused at the edge, like any bad input."""
    now = datetime.now(UTC)
    if when <= now:
        raise ConfigError(
            f"--deadline {str(given)!r} has passed (it is {now:%Y-%m-%dT%H:%M:%SZ} now): give a "
            "time to come, or --max-wait"
        )
    return when


def make_decision(
    approved: bool, by: str, reason: str = "", over_budget: bool = False
) -> ApprovalDecision:
    """An approval (or rejection), checked: ConfigError for an empty `by` or a long reason."""
    try:
        return ApprovalDecision(approved=approved, by=by, reason=reason, over_budget=over_budget)
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, "decision")) from None


def signed_for(
    binding: approvals.Binding, decision: ApprovalDecision, settings: Settings
) -> ApprovalDecision:
    """`decision` signed for what `binding` names (`jobs.binding`: the job, its incarnation, the
    provider and clip it waits for) with this machine's SPILLWAY_APPROVAL_SECRET (good for 15
    minutes); as it is without the secret, or when it carries a signature already."""
    secret = settings.SPILLWAY_APPROVAL_SECRET
    if secret is None or decision.signature is not None:
        return decision
    return approvals.sign(secret.get_secret_value(), binding, decision, datetime.now(UTC))


def new_job_id() -> str:
    return datetime.now(UTC).strftime("job-%Y%m%d-%H%M%S-") + os.urandom(3).hex()
