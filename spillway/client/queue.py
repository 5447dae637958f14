"""The GPU pool as people see it (docs/design.md, "GPU admission"): each host's places and the
line (`spillway queue`), and one job's position in it (`status --json`'s `queue`). Read by a
query of the running pool, so a worker must be running; a pool that never started means nobody
asked for a place, and a closed one holds nothing any more."""

from __future__ import annotations

from datetime import timedelta
from typing import cast

from temporalio.client import Client, WorkflowQueryRejectedError
from temporalio.common import QueryRejectCondition
from temporalio.service import RPCError, RPCStatusCode

from spillway.core import names
from spillway.core import search_attributes as sa
from spillway.core.errors import Failed
from spillway.core.gpu_pool import PoolView
from spillway.core.models import JobState, Plan, QueueSpot

QUERY_TIMEOUT = timedelta(seconds=10)
PATIENCE_READ = 100  # jobs of the line whose patience `spillway queue` reads


async def team_waiting(client: Client, task_queue: str, team: str) -> int | None:
    """Jobs of `team` in the GPU line now, as the pool's view has them (0: no pool runs; None:
    the pool did not answer, and the CLI cannot tell). Only the pool's query: a submit asks it,
    and a burst of submits must not list holders each."""
    try:
        view = await _running_view(client, task_queue)
    except WorkflowQueryRejectedError:
        return 0
    except RPCError as exc:
        return 0 if exc.status == RPCStatusCode.NOT_FOUND else None
    return sum(1 for item in view.line if item.team == team)


async def pool_view(client: Client, task_queue: str) -> PoolView:
    """A closed pool's last view is never shown: its holders may have ended since, and its line
    has moved on to a new pool."""
    try:
        view = await _running_view(client, task_queue)
    except WorkflowQueryRejectedError as rejected:
        return PoolView(
            hosts=[], line=[], pool="closed", closed=getattr(rejected.status, "name", None)
        )
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:  # no job has asked for a place yet
            return PoolView(hosts=[], line=[], pool="not_started")
        raise Failed(f"the GPU pool did not answer ({exc.message}): is a worker running?") from None
    await _holders_states(client, view)
    await _patience(client, view)
    return view


async def _running_view(client: Client, task_queue: str) -> PoolView:
    """The running pool's `view`; WorkflowQueryRejectedError: it is closed."""
    view: PoolView = await client.get_workflow_handle(names.pool_id(task_queue)).query(
        names.POOL_VIEW,
        result_type=PoolView,
        reject_condition=QueryRejectCondition.NOT_OPEN,
        rpc_timeout=QUERY_TIMEOUT,
    )
    return view


async def _holders_states(client: Client, view: PoolView) -> None:
    """Each place's holder's state, from Temporal's visibility in one list (the pool keeps none
    of it). A server that cannot list leaves them unknown (None)."""
    places = {p.job_id: p for host in view.hosts for p in host.places}
    if not places:
        return
    ids = ", ".join(f"'{job_id}'" for job_id in places)
    query = f"WorkflowType = '{names.VIDEO_JOB}' AND WorkflowId IN ({ids})"
    try:
        async for execution in client.list_workflows(query):
            state = execution.typed_search_attributes.get(sa.STATE)
            place = places.get(execution.id)
            if place is not None and state is not None and execution.close_time is None:
                place.state = cast(JobState, state)
    except RPCError:
        return


async def _patience(client: Client, view: PoolView) -> None:
    """When each job in line waiting by its patience goes to the cloud, from its plan (the
    memo it publishes); the first PATIENCE_READ of the line only."""
    patient = {item.job_id: item for item in view.line[:PATIENCE_READ] if item.state == "queued"}
    if not patient:
        return
    ids = ", ".join(f"'{job_id}'" for job_id in patient)
    query = f"WorkflowType = '{names.VIDEO_JOB}' AND WorkflowId IN ({ids})"
    try:
        async for execution in client.list_workflows(query):
            item = patient.get(execution.id)
            if item is None or execution.close_time is not None:
                continue
            plan = await execution.memo_value(names.PLAN_MEMO, None, type_hint=Plan)
            if isinstance(plan, Plan):
                item.patience_until = plan.patience_until
    except RPCError:
        return


async def spot(
    client: Client, task_queue: str, job_id: str, own: QueueSpot | None
) -> QueueSpot | None:
    """Where the job stands in the line as the running pool has it (None: not in it, or no
    pool runs); `own`, the job's last answer, only when the pool cannot say (no worker)."""
    handle = client.get_workflow_handle(names.pool_id(task_queue))
    try:
        found: QueueSpot | None = await handle.query(
            names.POOL_SPOT,
            job_id,
            result_type=QueueSpot,
            reject_condition=QueryRejectCondition.NOT_OPEN,
            rpc_timeout=QUERY_TIMEOUT,
        )
    except WorkflowQueryRejectedError:
        return None
    except RPCError as exc:
        return None if exc.status == RPCStatusCode.NOT_FOUND else own
    except Exception:
        return own
    return found
