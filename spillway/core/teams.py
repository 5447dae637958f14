"""The teams file (`SPILLWAY_TEAMS_FILE`; docs/design.md, "A studio of several teams"): who a job
is for, each team's share of the GPU places, its waiting limit, budget and approvers. Without a
file there is one team, `studio`, and everything behaves as with no teams at all."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator

from spillway.core.errors import ConfigError
from spillway.core.settings import read_config_file

STUDIO = "studio"  # the one team when there is no teams file
# A team's name is a search attribute's value (SpillwayTeam) and a metric label.
TeamName = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,39}$")]
Usd = Annotated[float, Field(ge=0, allow_inf_nan=False)]


class TeamBudget(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    day_usd: Usd | None = None
    month_usd: Usd | None = None


class Team(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    # Its share of the places: a freed place goes to the team holding the fewest per unit.
    share: Annotated[float, Field(gt=0, le=1000, allow_inf_nan=False)] = 1.0
    # Jobs queued or awaiting approval at once; None: no limit.
    max_waiting: Annotated[int, Field(ge=1, le=1_000_000)] | None = None
    budget: TeamBudget | None = None  # beside the studio's; None: only the studio's
    # Who may approve its cloud spend; None: anyone who may approve.
    approvers: (
        Annotated[list[Annotated[str, Field(min_length=1, max_length=100)]], Field()] | None
    ) = None


class Teams(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    default: TeamName  # the team of a job that names none
    teams: Annotated[dict[TeamName, Team], Field(min_length=1, max_length=100)]

    @model_validator(mode="after")
    def _default_is_a_team(self) -> Teams:
        if self.default not in self.teams:
            raise ValueError(
                f"default: {self.default!r} is not one of the teams ({', '.join(self.teams)})"
            )
        return self

    def team_of(self, name: str | None) -> str:
        """The team a job belongs to: its own, or the default. ConfigError: no such team."""
        if name is None:
            return self.default
        if name not in self.teams:
            raise ConfigError(f"no team {name!r}; the teams: {', '.join(sorted(self.teams))}")
        return name

    def shares(self) -> dict[str, float]:
        return {name: team.share for name, team in self.teams.items()}

    def max_waiting(self) -> dict[str, int]:
        return {n: t.max_waiting for n, t in self.teams.items() if t.max_waiting is not None}


def over_waiting(team: str, limit: int) -> str:
    """Why a job of a team at its waiting limit is refused (the CLI and the pool say the same)."""
    return f"team {team} has {limit} jobs waiting, its limit (max_waiting)"


ONE_TEAM = Teams(default=STUDIO, teams={STUDIO: Team()})


def load_teams(path: Path | None) -> Teams:
    """The teams file; None: the one team. A bad file: ConfigError naming the field."""
    if path is None:
        return ONE_TEAM
    return read_config_file(path, Teams, "teams file")
