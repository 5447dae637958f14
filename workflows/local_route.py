"""The LOCAL route of VideoJobWorkflow: on the GPU host the measurement chose, upload the job's
input images, submit to ComfyUI, wait, download, and take the prompt back out of ComfyUI when
the job is cancelled (docs/design.md, "GPU hosts and agents", "ComfyUI facts"). A host that goes
silent under the job (ComfyUI or its agent) is shown on the plan, and lost after
HOST_LOST_AFTER_S: an armed job then goes to the cloud. Workflow code.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, is_cancelled_exception

from workflows import activity_calls as calls
from workflows import admission
from workflows.job_state import LOCAL, VideoJobState, run_tag

with workflow.unsafe.imports_passed_through():
    from activities.comfyui.models import (
        ComfyUICancel,
        ComfyUIDownload,
        ComfyUIFinished,
        ComfyUISubmit,
        ComfyUIUpload,
        ComfyUIWait,
        HostBound,
        Release,
        prompt_id_for,
    )
    from spillway.core import names
    from spillway.core.decision import is_armed
    from spillway.core.gpu_pool import PoolLeave
    from spillway.core.hosts import no_answer
    from spillway.core.images import with_inputs
    from spillway.core.models import HostRef
    from workflows import texts

_T = TypeVar("_T")
_Bound = TypeVar("_Bound", bound="HostBound")
# The plan shows a silent host within a minute: 30 s of silence, plus a poll that timed out.
REPORT_SILENCE_AFTER_S = 30.0
# While a host stays silent the job looks again at most this far apart: a day of it is a few
# hundred history events, not thousands.
LOOK_AGAIN_S = 300.0


async def to_the_end(work: Awaitable[_T]) -> _T:
    """Awaits `work` even when the job is cancelled meanwhile, then lets the cancel through: what
    was sent (a prompt, a paid create) is known before the job cleans up after it."""
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        with contextlib.suppress(ActivityError):
            await task
        raise


class Preempted(Exception):
    """The pool gives the job's place to a more urgent job (SPILLWAY_PREEMPT): its render is
    out of ComfyUI (or named for the pool to take out), and it waits in line again."""


class PlaceTaken(Exception):
    """The GPU pool shows no place of the job's (an answer that was not the pool's; a reset
    run's place that went back; no pool running): nothing was posted, and the job asks for a
    place again."""


async def run(s: VideoJobState) -> bool:
    """Renders the job on its host. True: the host was lost and the job is armed, so the caller
    sends it to the cloud."""
    plan, job = s.plan, s.job
    if s.place is not None and s.place.host is not None:
        await _know_host(s, s.place.host)
    plan.route = "local"
    host = s.host_named(s.next_host)
    plan.host = host.name
    s.count(LOCAL)
    # A reset or re-run gets prompt ids of its own: a long-lived ComfyUI still holds the earlier
    # run's prompt (and its video) under the old one.
    tag = run_tag()
    graph = await _with_uploaded_inputs(s, host)
    if graph is None:
        return True
    info = workflow.info()
    # Not part of the workflow's decisions (the Replayer gives every run its first run's id):
    # it only tells the submit to look for the prompts of the run this one was reset from.
    reset_run = info.original_execution_run_id != info.run_id
    # A preempted render is no failed attempt: it posts once more.
    while plan.local_attempts < s.policy.comfyui_max_attempts + (plan.preempted is not None):
        if s.preempt is not None:
            raise Preempted  # nothing posted on this place yet
        plan.local_attempts += 1
        prompt_id = prompt_id_for(job.job_id, plan.local_attempts, tag)
        plan.prompt_id = prompt_id
        s.prompt_out = False
        s.set_state("running_local")
        submit = ComfyUISubmit(
            job_id=job.job_id,
            prompt_id=prompt_id,
            graph=graph,
            front=job.priority == 1,
            place_on=s.place.host if s.place is not None else None,
            place_asked_at=s.place.asked_at if s.place is not None else None,
            jobs_queue=info.task_queue,
            reset_run=reset_run,
        )
        silent_since = None
        try:
            # Never abandoned: a job cancelled mid-submit waits for it, then takes it back out.
            submitted = await _through_silence(
                s,
                host,
                submit,
                lambda req: to_the_end(
                    calls.comfyui_submit(
                        req, s.heartbeat, host, s.priority, agent_bound=s.host_lost
                    )
                ),
            )
        except ActivityError as err:
            if calls.place_taken(err):
                plan.local_attempts -= 1  # nothing was posted
                plan.prompt_id, s.prompt_out = None, True
                # The pool holds no place of the job's. Its ask stands (the answer may have been
                # anyone's, and the pool still has it in line), or with none running, the job's
                # ask starts one that finds the places still held.
                kept = s.place if workflow.patched(admission.KEPT_ASK) else None
                s.place = kept.model_copy(update={"host": None}) if kept else None
                raise PlaceTaken(host.name) from None
            earlier = calls.earlier_run_holds(err)
            if earlier:
                # The run it was reset from still renders on its place: out first.
                plan.local_attempts -= 1  # nothing was posted
                s.prompt_out = True
                for taken_out in earlier:
                    cancel = ComfyUICancel(prompt_id=taken_out)
                    await calls.comfyui_cancel(cancel, s.heartbeat, host, s.priority)
                    s.reason(f"earlier_run_prompt_taken_out={taken_out}")
                continue
            if not calls.agent_gone(err):
                raise
            # An earlier attempt may have posted before its agent died: the wait finds out.
            silent_since = workflow.now() - s.host_lost
        else:
            if submitted is None:
                return True
        if s.policy.preempt == "off":  # the pool preempts nobody: no second wait
            finished = await _follow(s, host, prompt_id, silent_since)
        else:
            finished = await _follow_unless_preempted(s, host, prompt_id, silent_since)
        if finished is None:
            return True
        if finished.outcome == "stalled":
            if await _stalled(s, host, finished):
                return True
            continue  # one more try, on the place it holds
        s.prompt_out = True  # ended, failed or forgotten: ComfyUI holds it no more
        s.render_s = finished.render_s
        if finished.outcome == "lost":
            # ComfyUI restarted and forgot the prompt: resubmitting locally costs nothing.
            s.reason(f"comfyui_lost_prompt={prompt_id}")
            continue
        download = ComfyUIDownload(job_id=job.job_id, files=finished.files, release=_release(s))
        downloaded = await _through_silence(
            s,
            host,
            download,
            lambda req: calls.comfyui_download(req, s.heartbeat, host, s.priority),
        )
        if downloaded is None:
            return True
        plan.outputs = downloaded.outputs
        if downloaded.released:
            s.place = None
        return False
    s.fail(texts.lost_too_often(plan.local_attempts))


def _release(s: VideoJobState) -> Release | None:
    """The job's place, for the download to give back when the outputs are home. No patch: a
    replay of a run of 0.5.0 reads its download's result without `released`, and gives the place
    back by its own signal as that run did (a patch would cost every job a search-attribute
    write)."""
    place = s.place
    if place is None or place.host is None:
        return None
    pool = names.pool_id(workflow.info().task_queue)
    leave = PoolLeave(job_id=s.job.job_id, asked_at=place.asked_at, render_s=s.render_s)
    return Release(pool_id=pool, leave=leave)


async def _through_silence(
    s: VideoJobState, host: HostRef, req: _Bound, call: Callable[[_Bound], Awaitable[_T]]
) -> _T | None:
    """`call(req)` until it succeeds, through any silence of the host: each call ends once the
    host has been silent until the job's next decision (HOST_SILENT), which the job then takes
    as for a wait. None: the host is lost and the job armed."""
    while True:
        req = req.model_copy(update={"report_silence_after_s": _next_look(s, req.silent_since)})
        try:
            done = await call(req)
        except ActivityError as err:
            silence = calls.host_silence(err)
            if silence is None:
                raise
        else:
            if texts.silent_since(s.plan) is not None:  # a silence the plan shows is over
                s.reason(texts.ANSWERS_AGAIN)
                s.publish()
            return done
        update: dict[str, Any] = {"silent_since": silence.silent_since}
        if isinstance(req, ComfyUISubmit) and silence.posted_at is not None:
            update["posted_at"] = silence.posted_at
        req = req.model_copy(update=update)
        silent_s = _note_silence(s, silence.silent_since)
        if await _host_lost(s, host, silence.silent_since, silent_s):
            return None


async def _follow(
    s: VideoJobState, host: HostRef, prompt_id: str, silent_since: datetime | None
) -> ComfyUIFinished | None:
    """Waits for the prompt's end, through any silence of the host. None: the host is lost and
    the job armed."""
    while True:
        wait = ComfyUIWait(
            job_id=s.job.job_id,
            prompt_id=prompt_id,
            report_silence_after_s=_next_look(s, silent_since),
            silent_since=silent_since,
            stall_rule=s.policy.stall_rule,
            relay_progress=True,
        )
        try:
            finished = await calls.comfyui_wait(
                wait, s.heartbeat, host, s.priority, agent_bound=s.host_lost
            )
        except ActivityError as err:
            if not calls.agent_gone(err):
                raise
            finished = None  # no agent picked the wait up: as silent as ComfyUI
            silent_since = silent_since or workflow.now() - s.host_lost
        if finished is not None and finished.outcome != "unreachable":
            if texts.silent_since(s.plan) is not None:  # a silence the plan shows is over
                s.reason(texts.ANSWERS_AGAIN)
                s.publish()
            silent_since = None
            if finished.outcome == "back":
                continue
            return finished
        if finished is not None:
            silent_since = silent_since or finished.silent_since
        assert silent_since is not None
        silent_s = _note_silence(s, silent_since)
        if await _host_lost(s, host, silent_since, silent_s):
            return None
        give_up_s = s.policy.unreachable_give_up_s
        if finished is None and silent_s >= 2 * s.policy.host_lost_after_s:
            # The agent is gone (each try already took host_lost): look again less often.
            pause = min(LOOK_AGAIN_S - s.policy.host_lost_after_s, give_up_s - silent_s)
            if pause > 0:
                await workflow.sleep(timedelta(seconds=pause))


async def _follow_unless_preempted(
    s: VideoJobState, host: HostRef, prompt_id: str, silent_since: datetime | None
) -> ComfyUIFinished | None:
    """`_follow`, unless the pool gives the place to a more urgent job first: then the prompt
    is taken out of ComfyUI (interrupted at its next node boundary when running, deleted when
    pending) before the place goes back, and the job raises Preempted. A render that ended
    first is the job's: it downloads and gives the place back as always."""
    if s.preempt is None:
        follow = asyncio.ensure_future(_follow(s, host, prompt_id, silent_since))
        told = asyncio.ensure_future(workflow.wait_condition(lambda: s.preempt is not None))
        try:
            await workflow.wait([follow, told], return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            follow.cancel()
            told.cancel()
            raise
        if follow.done():
            told.cancel()
            return follow.result()
        follow.cancel()
        with contextlib.suppress(asyncio.CancelledError, ActivityError):
            await follow
    assert s.preempt is not None
    try:
        cancel = ComfyUICancel(prompt_id=prompt_id)
        taken = await calls.comfyui_cancel(cancel, s.heartbeat, host, s.priority)
    except ActivityError as err:
        if is_cancelled_exception(err):
            raise
        # Its host does not answer: the give-back names the prompt, and the pool takes it out
        # before the place is anyone else's.
        workflow.logger.warning("job %s: preempted prompt not taken out: %s", s.job.job_id, err)
    else:
        s.prompt_out = True
        s.reason(f"preempted_prompt_{taken.was}={prompt_id}")
    raise Preempted


async def _stalled(s: VideoJobState, host: HostRef, finished: ComfyUIFinished) -> bool:
    """A render that stopped moving (RENDER_STALL_S): its prompt, and only it, is interrupted and
    taken out; then the job tries once more on its place, or goes to the cloud when armed (True);
    a second stall fails it, naming the host."""
    cancel = ComfyUICancel(prompt_id=finished.prompt_id)
    await calls.comfyui_cancel(cancel, s.heartbeat, host, s.priority)
    s.prompt_out = True
    s.reason(f"render_stalled={host.name}")
    still = finished.still_since or workflow.now()
    if sum(r.startswith("render_stalled=") for r in s.plan.reasons) >= 2:
        s.fail(texts.stalled_twice(host.name, still, finished.node))
    if await _armed_now(s):
        s.plan.overflow.trigger = "unreachable"
        why = texts.stalled_since(still, finished.node)
        s.plan.overflow.last_signal = no_answer(host.name, s.policy.thresholds, workflow.now(), why)
        return True
    return False


async def _host_lost(
    s: VideoJobState, host: HostRef, silent_since: datetime, silent_s: float
) -> bool:
    """The host-lost rule: silent for HOST_LOST_AFTER_S and armed, the job goes to the cloud
    (True); silent for UNREACHABLE_GIVE_UP_S, it fails naming the host."""
    if silent_s >= s.policy.host_lost_after_s and await _armed_now(s):
        s.reason(f"host_lost={host.name}")
        s.plan.overflow.trigger = "unreachable"
        why = f"its ComfyUI has not answered since {silent_since:%H:%M:%S} UTC"
        s.plan.overflow.last_signal = no_answer(host.name, s.policy.thresholds, workflow.now(), why)
        return True
    if silent_s >= s.policy.unreachable_give_up_s:
        s.fail(texts.host_gave_no_answer(host.name, silent_since, silent_s))
    return False


def _next_look(s: VideoJobState, silent_since: datetime | None) -> float:
    """The wait's report_silence_after_s: soon for a new silence, then at the moments the job
    decides something (host lost, give up) and every LOOK_AGAIN_S between them."""
    policy = s.policy
    if silent_since is None:
        return min(REPORT_SILENCE_AFTER_S, policy.host_lost_after_s, policy.unreachable_give_up_s)
    silent_s = (workflow.now() - silent_since).total_seconds()
    looks = [silent_s + LOOK_AGAIN_S, policy.unreachable_give_up_s]
    if policy.host_lost_after_s > silent_s:
        looks.append(policy.host_lost_after_s)
    return min(looks)


def _note_silence(s: VideoJobState, silent_since: datetime) -> float:
    """Shows the silence on the plan (once per silence); returns how long it has lasted."""
    reason = texts.silent_reason(silent_since)
    if reason not in s.plan.reasons:
        s.reason(reason)
        s.publish()
    return (workflow.now() - silent_since).total_seconds()


async def _know_host(s: VideoJobState, name: str) -> None:
    """The host the pool admitted the job to, also one added since the job read the workers'
    policy (the pool reads it anew): the job renders there or nowhere, never on another host
    beside that host's places."""
    if any(h.name == name for h in s.policy.hosts):
        return
    s.worker_policy = await calls.read_policy(s.job.job_id, local=not s.pooled)
    if not any(h.name == name for h in s.policy.hosts):
        s.fail(texts.admitted_to_unknown_host(name, [h.name for h in s.policy.hosts]))


async def _armed_now(s: VideoJobState) -> bool:
    """Armed by the policy in force now, not when the job started: the owner may have armed the
    fallback since (the create checks it once more)."""
    s.worker_policy = await calls.read_policy(s.job.job_id, local=not s.pooled)
    return is_armed(s.policy.fallback_enabled, s.policy.key_present, s.job.cloud is not None)


async def _with_uploaded_inputs(s: VideoJobState, host: HostRef) -> dict[str, Any] | None:
    """The graph with each input image uploaded to the host that renders it, its loader
    pointing at the uploaded file. Nothing to do (and no history event) without inputs. None:
    the host is lost and the job armed."""
    uploaded: dict[str, str] = {}
    for item in s.job.inputs:
        upload = ComfyUIUpload(job_id=s.job.job_id, input=item)
        done = await _through_silence(
            s,
            host,
            upload,
            lambda req: calls.comfyui_upload(req, s.heartbeat, host, s.priority),
        )
        if done is None:
            return None
        uploaded[done.node] = done.name
    return with_inputs(s.job.graph, uploaded) if uploaded else s.job.graph


async def cancel_prompt(s: VideoJobState) -> None:
    """A job shows `cancelled` only once ComfyUI no longer holds its prompt."""
    if s.plan.route != "local" or s.plan.prompt_id is None:
        return
    cancel = ComfyUICancel(prompt_id=s.plan.prompt_id)
    cancelled = await calls.comfyui_cancel(cancel, s.heartbeat, s.host_named(s.plan.host))
    s.prompt_out = True
    s.reason(f"comfyui_prompt_{cancelled.was}_cancelled")
