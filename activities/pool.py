"""The GPU pool's activities (docs/design.md, "GPU admission"): the start of a pool that is not
running, by signal-with-start with the ask of the job that found none (a job signals a running
pool from its own workflow code); the pool's check of the holders it has not heard from: a
holder that is closed, reset away or no longer holding this place gives it back; and, for a pool
that starts after an earlier one ended (terminated, failed), the places its jobs still hold and
its line."""

from __future__ import annotations

import asyncio
import contextlib
from datetime import UTC, datetime, timedelta

from pydantic import BaseModel
from temporalio import activity
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowQueryRejectedError,
)
from temporalio.common import QueryRejectCondition
from temporalio.service import RPCError, RPCStatusCode

from activities.comfyui.models import prompt_id_for
from spillway.core import names
from spillway.core import search_attributes as sa
from spillway.core.gpu_pool import (
    Drain,
    HeldPlace,
    Holder,
    LateCheck,
    PoolAsk,
    PoolInput,
    PoolLeave,
    PoolQuote,
    PoolView,
    Quoted,
)
from spillway.core.models import JobPlace, PlaceMode, Plan
from spillway.core.pool_book import PoolBook

CHECKS_AT_ONCE = 16
NEVER = datetime.min.replace(tzinfo=UTC)
ASK_TIMEOUT = timedelta(seconds=5)


class HolderCheck(BaseModel):
    holders: list[Holder]
    task_queue: str = ""  # the jobs' queue ("": a pool of 0.5.0, which does not say)


class HoldersChecked(BaseModel):
    gone: list[str]  # job ids whose place is free again
    answered: list[str]  # job ids that still hold their place
    # Of the gone: a prompt ComfyUI may still hold (a job terminated while it rendered), to be
    # taken out before the place is free.
    prompts: dict[str, str] = {}
    # Of the gone: jobs whose admitted run was reset away from the place, each with a prompt id
    # naming that run; every prompt of that run is taken out before the place is free.
    reset: dict[str, str] = {}


class Reset(BaseModel):
    """A running job holds the place no more, and the run admitted to it is not the one
    running: a reset moved the job away from it, maybe while that run rendered. `prompt_id`
    names the admitted run (attempt 0, never posted)."""

    prompt_id: str


class FindHolders(BaseModel):
    task_queue: str  # the jobs' queue


class Held(BaseModel):
    """A running job's ask, as the job keeps it: holding a place on `host`, or in the line."""

    job_id: str
    asked_at: datetime
    host: str | None
    mode: PlaceMode = "any"
    priority: int = 3
    run_id: str | None = None
    unfit: list[str] = []  # the hosts known to lack what its graph needs
    models: list[str] = []  # the model files its graph loads
    # Its patience, as the job itself keeps it (a pool that lost its line learns it here).
    start_by: datetime | None = None
    by_deadline: bool = False
    team: str | None = None


class HoldersFound(BaseModel):
    held: list[Held]
    # The hosts the pool that ended had drained (its memo): a drain outlives a terminate.
    drained: dict[str, Drain] = {}
    # Who held which place when it ended, by its memo; None: it kept none (a pool of 0.6.0).
    holders: dict[str, HeldPlace] | None = None


class ReadPlaces(BaseModel):
    job_ids: list[str]
    task_queue: str  # the jobs' queue


class PlacesRead(BaseModel):
    # Each job's own place (its `place` query); None: it holds no ask, is no running job of the
    # queue, or could not be asked now.
    places: dict[str, JobPlace | None]


# A job asks at its first decision (probing) and then waits in line (queued, or also for a
# person) or holds its place from its admission (still in the state it waited in while its
# inputs upload) until it ends.
ASKING_STATES = ("probing", "queued", "awaiting_approval", "running_local")


# Ends that run none of the job's own code (its cancel and failure paths take their prompt out,
# or name it in their give-back).
FORCED_ENDS = (WorkflowExecutionStatus.TERMINATED, WorkflowExecutionStatus.TIMED_OUT)


async def _plan(described: WorkflowExecutionDescription) -> Plan | None:
    try:
        return await described.memo_value(names.PLAN_MEMO, type_hint=Plan)
    except (KeyError, ValueError):
        return None


async def _named_prompt(described: WorkflowExecutionDescription, holder: Holder) -> str | None:
    """The prompt the job's give-back named, when the job's own plan (memo) names it too: a
    give-back in its name naming another job's prompt takes nothing out."""
    if holder.left_prompt is None:
        return None
    plan = await _plan(described)
    return holder.left_prompt if plan and plan.prompt_id == holder.left_prompt else None


async def _left_prompt(described: WorkflowExecutionDescription, holder: Holder) -> str | None:
    """The prompt a job ended by force had last posted on the holder's host, as its plan (memo)
    says; None when it had none there or had seen it end."""
    plan = await _plan(described)
    if plan is None:
        return None
    if plan.route != "local" or plan.host != holder.host or plan.prompt_id is None:
        return None
    if plan.state != "running_local" or plan.outputs:
        return None
    return plan.prompt_id


async def pool_holds(
    client: Client,
    jobs_queue: str,
    job_id: str,
    host: str,
    asked_at: datetime | None = None,
    within: timedelta = ASK_TIMEOUT,
) -> bool | None:
    """Whether the running GPU pool of `jobs_queue` shows a place on `host` held by `job_id`
    (for its ask of `asked_at`, when given). None: no pool runs, or one runs where no spillway
    worker answers it. Read off the pool's memo, which the server answers without the pool's
    worker (a query waits behind the pool's work: under a burst of 100 jobs it halved LOCAL
    throughput); a pool that keeps no holders there (0.6.0) is queried."""
    handle = client.get_workflow_handle(names.pool_id(jobs_queue))
    try:
        described = await handle.describe(rpc_timeout=within)
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            return None
        raise
    running = described.status == WorkflowExecutionStatus.RUNNING
    if not running or described.task_queue != names.pool_queue(jobs_queue):
        return None
    memo = await described.memo()
    if names.POOL_HOLDERS_MEMO in memo:
        shown = memo.get(names.holder_memo(job_id))
        if shown is None:
            return False
        place = HeldPlace.model_validate(shown)
        return place.host == host and (asked_at is None or place.asked_at == asked_at)
    try:
        view = await handle.query(
            names.POOL_VIEW,
            result_type=PoolView,
            reject_condition=QueryRejectCondition.NOT_OPEN,
            rpc_timeout=within,
        )
    except WorkflowQueryRejectedError:
        return None
    mine = [p for h in view.hosts if h.name == host for p in h.places if p.job_id == job_id]
    return any(p.clearing is None for p in mine)


class PoolActivities:
    def __init__(self, client: Client) -> None:
        self._client = client

    @activity.defn(name=names.POOL_START)
    async def start(self, ask: PoolAsk) -> None:
        """The pool of the job's task queue (the one this activity runs on); a running pool
        just takes the ask. A pool running under that id on another task queue (started there
        by someone else: no spillway worker answers it, and every job would wait for ever) is
        terminated first: a pool's state is only places and a line, which the next one takes
        back from the jobs themselves."""
        await self._start_with(names.POOL_ASK, ask)

    @activity.defn(name=names.POOL_START_BY_LEAVE)
    async def start_by_leave(self, leave: PoolLeave) -> None:
        """The same, with the give-back of a job that found no pool running: the pool that
        starts finds the places still held and hands the freed one on at once, where the line
        would otherwise wait for its next check (SPILLWAY_POOL_LINE_CHECK_S)."""
        await self._start_with(names.POOL_LEAVE, leave)

    async def _start_with(self, signal: str, message: PoolAsk | PoolLeave) -> None:
        queue = activity.info().task_queue
        await self._evict_foreign(queue)
        await self._client.start_workflow(
            names.GPU_POOL,
            PoolInput(),
            id=names.pool_id(queue),
            task_queue=names.pool_queue(queue),
            start_signal=signal,
            start_signal_args=[message],
        )

    async def _evict_foreign(self, queue: str) -> None:
        handle = self._client.get_workflow_handle(names.pool_id(queue))
        try:
            described = await handle.describe(rpc_timeout=ASK_TIMEOUT)
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return
            raise
        home = names.pool_queue(queue)
        if described.status != WorkflowExecutionStatus.RUNNING or described.task_queue == home:
            return
        activity.logger.warning(
            "the GPU pool %s runs on task queue %r, not spillway's %r: terminated",
            handle.id,
            described.task_queue,
            home,
        )
        with contextlib.suppress(RPCError):  # ended meanwhile
            await handle.terminate(
                reason=f"spillway: a GPU pool on task queue {described.task_queue!r}, where no "
                f"spillway worker answers; spillway's runs on {home!r}"
            )

    @activity.defn(name=names.POOL_QUOTE_ACTIVITY)
    async def quote(self, req: PoolQuote) -> Quoted:
        """Where the ask would stand in the running pool now (its `quote` query); with no pool
        running, nobody holds a place or waits."""
        queue = activity.info().task_queue
        handle = self._client.get_workflow_handle(names.pool_id(queue))
        try:
            quoted: Quoted = await handle.query(
                names.POOL_QUOTE,
                req.ask,
                result_type=Quoted,
                reject_condition=QueryRejectCondition.NOT_OPEN,
                rpc_timeout=ASK_TIMEOUT,
            )
            return quoted
        except WorkflowQueryRejectedError:
            pass  # closed: the next ask starts a new pool
        except RPCError as err:
            if err.status != RPCStatusCode.NOT_FOUND:
                raise
        book = PoolBook(PoolInput())
        book.configure(req.hosts)
        return book.quote(req.ask, datetime.now(UTC))

    @activity.defn(name=names.POOL_LATE_ACTIVITY)
    async def confirm_late(self, ask: PoolAsk) -> LateCheck:
        """Whether the job's own ask is late by the estimate of the pool spillway runs for the
        job's task queue (its `late` query), asked by the job before it leaves the line for the
        cloud: an answer saying `late` is a signal anyone with signal rights can send. No pool
        running, one on another task queue (not spillway's), or one that cannot answer now:
        not late (the job waits on, and its patience's own timer still ends the wait)."""
        queue = activity.info().task_queue
        handle = self._client.get_workflow_handle(names.pool_id(queue))
        try:
            described = await handle.describe(rpc_timeout=ASK_TIMEOUT)
            if described.task_queue != names.pool_queue(queue):
                activity.logger.warning(
                    "gpu pool %s runs on %r, not spillway's: its estimate is not taken",
                    handle.id,
                    described.task_queue,
                )
                return LateCheck()
            checked: LateCheck = await handle.query(
                names.POOL_LATE,
                ask,
                result_type=LateCheck,
                reject_condition=QueryRejectCondition.NOT_OPEN,
                rpc_timeout=ASK_TIMEOUT,
            )
            return checked
        except (WorkflowQueryRejectedError, RPCError) as err:
            activity.logger.info("job %s: lateness not confirmed: %s", ask.job_id, err)
            return LateCheck()

    @activity.defn(name=names.POOL_CHECK)
    async def check_holders(self, check: HolderCheck) -> HoldersChecked:
        limit = asyncio.Semaphore(CHECKS_AT_ONCE)

        async def held(holder: Holder) -> bool | str | Reset | None:
            async with limit:
                return await self._still_holds(holder, check.task_queue)

        results = await asyncio.gather(*(held(h) for h in check.holders))
        pairs = list(zip(check.holders, results, strict=True))
        return HoldersChecked(
            gone=[h.job_id for h, r in pairs if r is False or isinstance(r, str | Reset)],
            answered=[h.job_id for h, r in pairs if r is True],
            prompts={h.job_id: r for h, r in pairs if isinstance(r, str)},
            reset={h.job_id: r.prompt_id for h, r in pairs if isinstance(r, Reset)},
        )

    @activity.defn(name=names.POOL_FIND)
    async def find_holders(self, find: FindHolders) -> HoldersFound:
        """The places the running jobs of `find.task_queue` hold and the asks they wait in line
        with, as each job says. Nothing when
        no pool ran before this one (the first start: nobody can hold a place yet), and nothing
        when the server cannot list (the time-skipping test server)."""
        pool = names.pool_id(find.task_queue)
        try:
            earlier = await self._client.count_workflows(
                f"WorkflowId = '{pool}' AND ExecutionStatus != 'Running'"
            )
            if not earlier.count:
                return HoldersFound(held=[])
            drained, holders = await self._left_before(pool)
            states = ", ".join(f"'{state}'" for state in ASKING_STATES)
            running = [
                (execution.id, execution.run_id)
                async for execution in self._client.list_workflows(
                    f"WorkflowType = '{names.VIDEO_JOB}' AND TaskQueue = '{find.task_queue}' "
                    f"AND ExecutionStatus = 'Running' AND {sa.STATE.name} IN ({states})"
                )
            ]
        except RPCError as err:
            if err.status != RPCStatusCode.UNIMPLEMENTED:
                raise
            return HoldersFound(held=[])
        limit = asyncio.Semaphore(CHECKS_AT_ONCE)

        async def place_of(job_id: str, run_id: str) -> Held | None:
            async with limit:
                try:
                    place = await self._client.get_workflow_handle(job_id).query(
                        names.JOB_PLACE, result_type=JobPlace, rpc_timeout=ASK_TIMEOUT
                    )
                except Exception as err:  # ended meanwhile, or cannot answer now
                    activity.logger.info("job %s not asked for its place: %s", job_id, err)
                    return None
            if place is None:
                return None
            return Held(
                job_id=job_id,
                asked_at=place.asked_at,
                host=place.host,
                mode=place.mode,
                priority=place.priority,
                run_id=run_id,
                unfit=place.unfit,
                models=place.models,
                start_by=place.start_by,
                by_deadline=place.by_deadline,
                team=place.team,
            )

        found = await asyncio.gather(*(place_of(job_id, run_id) for job_id, run_id in running))
        return HoldersFound(
            held=[h for h in found if h is not None], drained=drained, holders=holders
        )

    async def _left_before(self, pool: str) -> tuple[dict[str, Drain], dict[str, HeldPlace] | None]:
        """The drains and the holders in the memo of the pool's run that ended last (one run per
        pool that ended: those that continued as new are not listed)."""
        last = None
        async for execution in self._client.list_workflows(
            f"WorkflowId = '{pool}' AND ExecutionStatus != 'Running' "
            "AND ExecutionStatus != 'ContinuedAsNew'"
        ):
            if last is None or (execution.close_time or NEVER) > (last.close_time or NEVER):
                last = execution
        if last is None:
            return {}, None
        try:
            memo = await last.memo()
        except (ValueError, TypeError) as err:  # not what a pool wrote
            activity.logger.warning("gpu pool %s: its memo was not read: %s", pool, err)
            return {}, None
        try:
            kept = memo.get(names.POOL_DRAINED_MEMO) or {}
            drained = {str(host): Drain.model_validate(d) for host, d in dict(kept).items()}
        except (ValueError, TypeError) as err:  # not what a pool wrote: no drain
            activity.logger.warning("gpu pool %s: its drains were not read: %s", pool, err)
            drained = {}
        if names.POOL_HOLDERS_MEMO not in memo:
            return drained, None
        try:
            held = {
                key.removeprefix(names.POOL_HOLDER_MEMO): HeldPlace.model_validate(place)
                for key, place in memo.items()
                if key.startswith(names.POOL_HOLDER_MEMO)
            }
            return drained, held
        except (ValueError, TypeError) as err:  # not what a pool wrote: every claim counts
            activity.logger.warning("gpu pool %s: its holders were not read: %s", pool, err)
            return drained, None

    @activity.defn(name=names.POOL_READ_PLACES)
    async def read_places(self, read: ReadPlaces) -> PlacesRead:
        """Each job's own place, as a running job of `read.task_queue` keeps it: the only word
        a lined ask's mode or priority changes on."""
        limit = asyncio.Semaphore(CHECKS_AT_ONCE)

        async def place_of(job_id: str) -> JobPlace | None:
            handle = self._client.get_workflow_handle(job_id)
            async with limit:
                try:
                    described = await handle.describe(rpc_timeout=ASK_TIMEOUT)
                    if (
                        described.status != WorkflowExecutionStatus.RUNNING
                        or described.workflow_type != names.VIDEO_JOB
                        or described.task_queue != read.task_queue
                    ):
                        return None
                    place: JobPlace | None = await handle.query(
                        names.JOB_PLACE, result_type=JobPlace, rpc_timeout=ASK_TIMEOUT
                    )
                    return place
                except Exception as err:  # gone, or cannot answer now
                    activity.logger.info("job %s not asked for its place: %s", job_id, err)
                    return None

        found = await asyncio.gather(*(place_of(j) for j in read.job_ids))
        return PlacesRead(places=dict(zip(read.job_ids, found, strict=True)))

    async def _still_holds(self, holder: Holder, task_queue: str) -> bool | str | Reset | None:
        """False: the place is free again (a workflow that is not a running job of this queue
        holds none, whoever asked in its name); a prompt id: free once that prompt is out of
        ComfyUI (the job was ended by force while it rendered there, or its give-back named it
        and its plan agrees); a `Reset`: free once the prompts of the run admitted are out (a
        reset moved the job to another run); None: unknown now
        (asked again later, never freed on a guess: that could overbook the card)."""
        handle = self._client.get_workflow_handle(holder.job_id)
        try:
            described = await handle.describe(rpc_timeout=ASK_TIMEOUT)
            if described.status in FORCED_ENDS and described.workflow_type == names.VIDEO_JOB:
                return await _left_prompt(described, holder) or False
            if described.status != WorkflowExecutionStatus.RUNNING:
                return await _named_prompt(described, holder) or False
            if described.workflow_type != names.VIDEO_JOB or (
                task_queue and described.task_queue != task_queue
            ):
                activity.logger.warning(
                    "holder %s is a %s on %s, not a job of %s: its place is free",
                    holder.job_id,
                    described.workflow_type,
                    described.task_queue,
                    task_queue,
                )
                return False
            place = await handle.query(
                names.JOB_PLACE, result_type=JobPlace, rpc_timeout=ASK_TIMEOUT
            )
        except RPCError as err:
            if err.status == RPCStatusCode.NOT_FOUND:
                return False
            activity.logger.info("holder %s not checked: %s", holder.job_id, err)
            return None
        except Exception as err:  # a query the job could not answer now
            activity.logger.info("holder %s not checked: %s", holder.job_id, err)
            return None
        mine = (holder.host, None)
        # Its own ask: holding the place, or about to take it (the answer is on its way, or its
        # submit found no pool to confirm the place with, and it asked again); not a place it
        # let go of for a preemption (it waits in line again with the same ask).
        let_go = place is not None and place.host is None and place.preempted_by is not None
        if (
            place is not None
            and place.asked_at == holder.asked_at
            and place.host in mine
            and not let_go
        ):
            return True
        named = await _named_prompt(described, holder)
        if named is not None:
            return named
        if holder.run_id is not None and described.run_id != holder.run_id:
            return Reset(prompt_id=prompt_id_for(holder.job_id, 0, names.run_tag(holder.run_id)))
        return False
