"""`spillway health`'s look at the GPU pool's workflow (docs/design.md, "GPU admission"): whether
it runs, how long its current run is, its places and line, and whether it is wedged, with the
remedy for each."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

from spillway.cli.wedged import (
    WedgedWorkflow,
    enum_name,
    failing,
    history_tail,
    reset_from,
    wedged_run,
)
from spillway.core.gpu_pool import Drain

if TYPE_CHECKING:
    from temporalio.client import Client


PoolState = Literal["running", "not_started", "closed", "unknown"]


class PoolHealth(BaseModel):
    """The GPU pool's workflow (docs/design.md, "GPU admission"), read off
    DescribeWorkflowExecution, the tail of its history and its `view` query. Jobs start it by
    their first ask, so "not_started" is normal until a job has asked for a GPU place."""

    # running; not_started: no run ever had its id; closed: its latest run ended (`status` says
    # how); unknown: it could not be described, or it is neither running nor closed (paused).
    state: PoolState
    workflow_id: str
    run_id: str | None = None
    status: str | None = None  # the latest run's: RUNNING, TERMINATED, FAILED, TIMED_OUT, ...
    history_length: int | None = None  # events in the current run
    long_history: bool = False  # over LONG_HISTORY events: it is not continuing as new
    # What Temporal told the run at its last workflow task (describe does not carry it).
    continue_as_new_suggested: bool | None = None
    places_in_use: int | None = None  # from the `view` query; None when it did not answer
    line_length: int | None = None
    drained: dict[str, Drain] = {}  # hosts given no new places (`spillway host drain`)
    wedged: WedgedWorkflow | None = None
    # The current run was made by an operator's reset of this run (its history began as it): its
    # places and line are as they were at the reset point.
    reset_from: str | None = None
    error: str | None = None


# The pool ends its run after PoolInput.signals_per_run (500) signals or when Temporal suggests
# it (at 4,096 events by default: limit.historyCount.suggestContinueAsNew), whichever comes first,
# once what is under way has ended (a probe takes 10 s at most). A run well past both is not
# continuing as new, and every replay of it grows slower: Temporal warns at 10,240 events and
# terminates the run at 51,200.
LONG_HISTORY = 5_000
# A pool answers its `view` query at once from its book: a longer wait means no worker serves
# its queue, and `health` should not hang on it.
POOL_QUERY_TIMEOUT = timedelta(seconds=5)


def _minutes(seconds: float) -> str:
    return f"{seconds / 60:g} minutes" if seconds >= 60 else f"{seconds:g} s"


# What a pool's end costs the line, said where people see a closed or wedged pool.
NEXT_POOL = (
    "the next message a job sends (an ask, a give-back at the end of a render, a line check) "
    "starts a new pool, which takes back the places still held (a holder that ended meanwhile "
    "has its prompt taken out of ComfyUI first) and the line in its order: a job in line is "
    "admitted within seconds of a holder's end"
)


def pool_remedy(pool_id: str, line_check_s: float) -> str:
    return (
        f"terminate it (`temporal workflow terminate --workflow-id {pool_id}`): nothing is lost, "
        f"its state is only the places and the line; {NEXT_POOL} (at the latest when a job in "
        f"line asks again, within {_minutes(line_check_s)}: SPILLWAY_POOL_LINE_CHECK_S)"
    )


def pool_start_command(task_queue: str) -> str:
    """The `temporal` command that starts the pool before any job asks (an empty PoolInput)."""
    from spillway.core import names

    return (
        f"temporal workflow start --type {names.GPU_POOL} --task-queue "
        f"{names.pool_queue(task_queue)} --workflow-id {names.pool_id(task_queue)} --input '{{}}'"
    )


async def pool_health(
    client: Client,
    task_queue: str,
    *,
    line_check_s: float,
    long_history: int = LONG_HISTORY,
    query_timeout: timedelta = POOL_QUERY_TIMEOUT,
) -> PoolHealth:
    """The GPU pool of `task_queue`: whether it runs, its current run's length, its places and
    line, and whether its workflow task keeps failing; what is wrong, or what Temporal refused or
    did not answer, is in `error`."""
    from temporalio.api.enums.v1 import WorkflowExecutionStatus as Status
    from temporalio.client import WorkflowQueryFailedError
    from temporalio.service import RPCError, RPCStatusCode

    from activities.spend.ledger import RPC_TIMEOUT
    from spillway.core import names
    from spillway.core.gpu_pool import PoolView

    pool_id = names.pool_id(task_queue)
    report = PoolHealth(state="unknown", workflow_id=pool_id)
    handle = client.get_workflow_handle(pool_id)
    try:
        described = await handle.describe(rpc_timeout=RPC_TIMEOUT)
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            report.state = "not_started"
        else:
            report.error = f"the GPU pool ({pool_id}) could not be described: {exc.message}"
        return report
    info = described.raw_description
    run = info.workflow_execution_info
    report.run_id = run.execution.run_id
    report.status = enum_name(Status, run.status, "WORKFLOW_EXECUTION_STATUS_")
    report.history_length = run.history_length
    report.long_history = run.history_length > long_history
    where = f"the GPU pool ({pool_id}, run {report.run_id})"
    if run.status != Status.WORKFLOW_EXECUTION_STATUS_RUNNING:
        if not run.HasField("close_time"):  # paused, or a status newer than this SDK
            report.error = f"{where} is {report.status}: it answers no job until it runs again"
            return report
        report.state = "closed"
        report.error = (
            f"{where} is closed ({report.status}): nothing is lost; {NEXT_POOL} (at the latest "
            f"when a job in line asks again, within {_minutes(line_check_s)}: "
            f"SPILLWAY_POOL_LINE_CHECK_S); to start it now: {pool_start_command(task_queue)}"
        )
        return report
    report.state = "running"
    report.wedged = await wedged_run(client, info, pool_remedy(pool_id, line_check_s))
    if report.wedged is not None:
        # A wedged pool answers no query either (it would only time out).
        report.error = (
            f"{where} is wedged: {failing(report.wedged)}; it answers no ask, so no job gets "
            f"a GPU place: {report.wedged.remedy}"
        )
        return report
    report.continue_as_new_suggested = await _continue_as_new_suggested(
        client, pool_id, report.run_id
    )
    problems = []
    report.reset_from = await reset_from(client, pool_id, report.run_id)
    if report.reset_from is not None:
        problems.append(
            f"{where} was made by a reset (its history began as run {report.reset_from}'s): its "
            "places and line are as they were at the reset point, places handed out since are "
            f"not counted and it may overbook the card; {pool_remedy(pool_id, line_check_s)}"
        )
    try:
        view = await handle.query(names.POOL_VIEW, result_type=PoolView, rpc_timeout=query_timeout)
    except (RPCError, WorkflowQueryFailedError) as exc:
        problems.append(
            f"{where} did not answer its query within {query_timeout.total_seconds():g}s "
            f"({exc}): is a worker running (spillway worker)?"
        )
    else:
        report.places_in_use = sum(len(h.places) for h in view.hosts)
        report.line_length = len(view.line)
        report.drained = {h.name: h.drained for h in view.hosts if h.drained is not None}
    if report.long_history:
        suggested = ", though Temporal suggests it" if report.continue_as_new_suggested else ""
        problems.append(
            f"{where} has {run.history_length} events in its current run (over {long_history}): "
            f"it is not continuing as new{suggested}, and Temporal terminates a run at 51,200 "
            f"events; {pool_remedy(pool_id, line_check_s)}"
        )
    report.error = "; ".join(problems) or None
    return report


async def _continue_as_new_suggested(client: Client, workflow_id: str, run_id: str) -> bool | None:
    """What the run's last started workflow task said; None when it is not among the last
    events (a flood of signals since) or they cannot be read."""
    from temporalio.api.enums.v1 import EventType

    for event in await history_tail(client, workflow_id, run_id):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            return event.workflow_task_started_event_attributes.suggest_continue_as_new
    return None
