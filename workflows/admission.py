"""A job's side of GPU admission (docs/design.md, "GPU admission"): it asks the GPU pool for a
place by signal (a pool that is not running is started by an activity, with that ask), learns
the answer by the pool's signal, waits in the line holding no activity and no heartbeat, only
timers (its line check; the approval window's end, the give-up and its patience where they
apply), and gives its place back at every end. An answer to an ask the job no
longer stands by (it went to the cloud, was cancelled, asked again) is given back at once.
Workflow code.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

from workflows import activity_calls as calls
from workflows.job_state import VideoJobState

with workflow.unsafe.imports_passed_through():
    from activities.comfyui.capabilities import graph_shape, model_files
    from spillway.core import names
    from spillway.core.gpu_pool import HostSeen, LateCheck, PoolAnswer, PoolAsk, PoolLeave
    from spillway.core.models import JobPlace, PlaceMode, Preemption, QueueSpot

# Runs of 0.4.0 decide without the pool (a waiting job of theirs re-probes on its own) and read
# the policy as a local activity.
GPU_POOL = "gpu-pool"
# Runs of 0.5.0 wait in line without a timer: a pool that ended strands them.
LINE_CHECK = "gpu-pool-line-check"
# Runs of 0.5.0 ask an unanswering pool again by signal, whatever queue it runs on.
POOL_HOME = "gpu-pool-home"
# Runs of 0.5.0 give a stray place back from the handler that received it.
STRAYS_BY_RUN = "gpu-pool-strays-by-run"
# Runs of 0.6.0 ask anew when their submit finds no place of theirs in the pool, and start no
# pool with a give-back.
KEPT_ASK = "gpu-pool-kept-ask"


async def ask(
    s: VideoJobState,
    *,
    wait: bool,
    mode: PlaceMode,
    fresh: bool = True,
    start_by: datetime | None = None,
    by_deadline: bool = False,
) -> PoolAnswer:
    """A place now, a position in the line (`wait`), or "full". `fresh`: the job's own probe
    just ran, and the pool may use it. `start_by`: a first ask's patience (the pool tells the
    job when the line's estimate passes it)."""
    if s.place is not None and s.place.host is not None:
        # An ask it kept (its submit found no place of its own) was answered with a place
        # while the job decided again: it holds it, and renders there whatever host its new
        # probe would have picked.
        s.next_host = s.place.host
        return PoolAnswer(asked_at=s.place.asked_at, host=s.place.host)
    if s.place is None:
        s.place = JobPlace(
            asked_at=workflow.now(),
            mode=mode,
            priority=s.job.priority,
            unfit=s.unfit or [],
            models=model_files(s.job.graph),
            start_by=start_by,
            by_deadline=by_deadline,
            team=s.plan.team,
        )
    place = s.place.model_copy(update={"mode": mode})
    s.place = place
    s.answer = None
    request = PoolAsk(
        job_id=s.job.job_id,
        asked_at=place.asked_at,
        priority=s.job.priority,
        mode=mode,
        wait=wait,
        seen=_seen(s) if fresh else [],
        places={h.name: h.max_jobs for h in s.policy.hosts},
        run_id=workflow.info().run_id,
        unfit=place.unfit,
        models=place.models,
        start_by=place.start_by,
        by_deadline=place.by_deadline,
        shape=graph_shape(s.job.graph),
        team=place.team,
        preempted_by=place.preempted_by,
    )
    unanswered = False
    while True:
        # Asked again once unanswered, by the activity: it also finds a pool that runs where
        # no spillway worker polls (and ends it), which a signal would reach all the same.
        by_activity = unanswered and workflow.patched(POOL_HOME)
        if by_activity or not await _signal_pool(names.POOL_ASK, request):
            await calls.pool_start(request)
        # Unanswered (SPILLWAY_POOL_ASK_AGAIN_S): the same ask again, its place in the line kept;
        # a pool that was terminated is started again by it.
        again = timedelta(seconds=s.policy.pool_ask_again_s)
        if await s.alarms.wait(lambda: s.answer is not None, again):
            break
        workflow.logger.info("gpu pool did not answer job %s: asking again", s.job.job_id)
        unanswered = True
    answer = s.answer
    assert answer is not None
    s.answer = None
    if answer.host is None and answer.position is None:
        s.place = None  # not in the line: full, and the job goes elsewhere
    return answer


async def check(s: VideoJobState) -> None:
    """While it waits in line: the same ask again, which a pool that has it leaves unanswered;
    a pool that lost it (a new pool after one was terminated) lines it by its first ask time,
    and no pool at all is started with it."""
    request = _standing(s)
    if not await _signal_pool(names.POOL_ASK, request):
        await calls.pool_start(request)


async def confirm_late(s: VideoJobState) -> LateCheck:
    """Whether the pool spillway runs for the job's task queue puts the job's own standing ask
    (its ask time, its own patience) past that patience: the only word a job leaves the line
    for the cloud on before its patience is out. A `late` answer is a signal, which anyone with
    signal rights can send, and an ask in the job's name can change what the pool holds for it;
    the pool's query, read by spillway's own activity, takes the job's ask as the job sent it.
    Not confirmed when the pool cannot say: the job waits on, and its patience ends the wait."""
    try:
        return await calls.pool_confirm_late(_standing(s))
    except ActivityError as err:
        if is_cancelled_exception(err):
            raise
        workflow.logger.info("job %s: lateness not confirmed: %s", s.job.job_id, err)
        return LateCheck()


def _standing(s: VideoJobState) -> PoolAsk:
    """The job's standing ask, as it sent it."""
    place = s.place
    assert place is not None
    return PoolAsk(
        job_id=s.job.job_id,
        asked_at=place.asked_at,
        priority=s.job.priority,
        mode=place.mode,
        again=True,
        run_id=workflow.info().run_id,
        unfit=place.unfit,
        models=place.models,
        start_by=place.start_by,
        by_deadline=place.by_deadline,
        shape=graph_shape(s.job.graph),
        team=place.team,
        preempted_by=place.preempted_by,
    )


def take(s: VideoJobState, answer: PoolAnswer) -> bool:
    """The pool's answer, if it is to the job's standing ask. False: it is not (a place given
    to an ask the job left must go back)."""
    place = s.place
    if place is None or place.asked_at != answer.asked_at:
        return False
    if place.host is not None:  # the same answer again (it asked twice): it holds that place
        if (
            answer.preempted_by is not None
            and answer.host == place.host
            and s.plan.preempted is None  # never twice
            and s.preempt is None
        ):
            s.preempt = Preemption(by=answer.preempted_by, at=workflow.now(), host=place.host)
        return True
    if answer.host is not None:
        s.place = place.model_copy(update={"host": answer.host})
        s.next_host = answer.host
        s.plan.queue = None
    elif answer.position is not None:
        s.plan.queue = QueueSpot(
            position=answer.position,
            ahead=answer.position - 1,
            eta_s=answer.eta_s,
            team_places=answer.team_places,
        )
    s.late = s.late or answer.late
    s.answer = answer
    return True


def admitted(s: VideoJobState) -> bool:
    return s.place is not None and s.place.host is not None


async def leave(s: VideoJobState) -> None:
    """Gives the place back, or leaves the line; nothing when it has neither."""
    place = s.place
    if place is None:
        return
    s.place = None
    s.plan.queue = None
    lingering = None if s.prompt_out or place.host is None else s.plan.prompt_id
    render_s = s.render_s if place.host is not None else None
    await give_back(s, place.asked_at, lingering, render_s)


async def let_go(s: VideoJobState) -> None:
    """Preempted: the place goes back to the pool, which hands it to the preemptor once a holder
    check confirms the job let go (and, when the job could not take its prompt out, once the
    pool has), and the job keeps its first ask time to wait in line again (never to be
    preempted twice)."""
    order, place = s.preempt, s.place
    assert order is not None and place is not None
    s.preempt = None
    s.plan.preempted = order
    s.place = place.model_copy(update={"host": None, "preempted_by": order.by})
    lingering = None if s.prompt_out else s.plan.prompt_id
    await give_back(s, place.asked_at, lingering)


async def give_back(
    s: VideoJobState,
    asked_at: datetime,
    prompt_id: str | None = None,
    render_s: float | None = None,
) -> None:
    """A pool that is not running is started with it (it finds the places still held, and
    hands this one on). `prompt_id`: a prompt ComfyUI may still hold (the job left its host
    without knowing), which the pool takes out before the place is free again; `render_s`: its
    render, timed by ComfyUI."""
    leave = PoolLeave(
        job_id=s.job.job_id, asked_at=asked_at, prompt_id=prompt_id, render_s=render_s
    )
    if not await _signal_pool(names.POOL_LEAVE, leave) and workflow.patched(KEPT_ASK):
        # A pool that ended (terminated) leaves the line waiting until a job's line check:
        # started now, it hands this place on at once.
        await calls.pool_start_by_leave(leave)


async def _signal_pool(name: str, message: PoolAsk | PoolLeave) -> bool:
    """False: no pool runs for the job's task queue (the server found none to signal)."""
    pool = workflow.get_external_workflow_handle(names.pool_id(workflow.info().task_queue))
    try:
        # Shielded: a cancel of the job must not cancel a signal the server may already have
        # (the SDK then sends a core-only cancel for a recorded signal, and the job's workflow
        # task failed with "Invalid transition in state machine"); the job still sees the cancel.
        await asyncio.shield(asyncio.ensure_future(pool.signal(name, message)))
    except ApplicationError as err:
        workflow.logger.info("gpu pool not signalled: %s", err)
        return False
    return True


def _seen(s: VideoJobState) -> list[HostSeen]:
    """The hosts as the job's latest probe found them, the one it would take first."""
    readings = sorted(s.readings.items(), key=lambda item: (item[0] != s.next_host, item[0]))
    return [
        HostSeen(
            name=name,
            reachable=r.reachable,
            headroom=r.reachable and not r.overloaded,
            capabilities=s.hosts_have.get(name),
        )
        for name, r in readings
    ]
