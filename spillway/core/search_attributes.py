"""The custom search attributes a job carries, so `spillway list --state ...` and the Temporal UI's
filter find jobs. Registered on the namespace by `spillway init` (and the test fixtures): the
server rejects a workflow that sets an unregistered one."""

from __future__ import annotations

from temporalio.common import SearchAttributeKey

STATE = SearchAttributeKey.for_keyword("SpillwayState")
ROUTE = SearchAttributeKey.for_keyword("SpillwayRoute")
TRIGGER = SearchAttributeKey.for_keyword("SpillwayTrigger")
OVERLOADED = SearchAttributeKey.for_bool("SpillwayOverloaded")
HOST = SearchAttributeKey.for_keyword("SpillwayHost")  # the GPU host of a local job
# Who the job is for (SPILLWAY_TEAMS_FILE). Set by the client that starts the job and never
# upserted: a job's team does not change. A job without it counts as the default team.
TEAM = SearchAttributeKey.for_keyword("SpillwayTeam")

ALL = (STATE, ROUTE, TRIGGER, OVERLOADED, HOST, TEAM)
