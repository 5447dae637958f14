"""Measuring in VideoJobWorkflow: every GPU host probed at once, the host with headroom picked
for the LOCAL route, and the latest reading kept on the plan to explain a wait
(docs/design.md, "GPU hosts and agents"). Workflow code."""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError, FailureError

from workflows import activity_calls as calls
from workflows.job_state import VideoJobState

with workflow.unsafe.imports_passed_through():
    from activities.comfyui.models import HostFit
    from spillway.core.hosts import no_answer, pick_host
    from spillway.core.models import HostRef, LoadStatus


async def measure(s: VideoJobState) -> LoadStatus:
    """Every GPU host at once; the job takes the one with headroom."""
    readings = await asyncio.gather(*(probe(s, host) for host in s.policy.hosts))
    s.readings = {r.host or "": r for r in readings}
    return pick(s)


def pick(s: VideoJobState) -> LoadStatus:
    """Among the hosts that can run the job, the one with headroom; its reading."""
    unfit = s.unfit or []
    # All of them when a policy read since names none but those hosts: the pool's line then says
    # no host of the job's answers, where an empty choice would fail the workflow task.
    readings = {n: r for n, r in s.readings.items() if n not in unfit}
    choice = pick_host(readings or s.readings)
    s.next_host = choice.host or choice.fallback
    return choice.load


async def probe(s: VideoJobState, host: HostRef) -> LoadStatus:
    try:
        load = await calls.probe(s.job.job_id, host, s.priority)
    except ActivityError as err:
        load = no_answer(host.name, s.policy.thresholds, workflow.now(), agent_silence(err))
    return load.model_copy(update={"host": host.name})


async def fits(s: VideoJobState) -> dict[str, HostFit]:
    """Whether each GPU host can run the job's graph, all asked at once. A host whose agent
    does not answer is not ruled out (the probe's rules decide about it)."""
    found = await asyncio.gather(*(_fit(s, host) for host in s.policy.hosts))
    return {host.name: fit for host, fit in zip(s.policy.hosts, found, strict=True)}


async def _fit(s: VideoJobState, host: HostRef) -> HostFit:
    try:
        return await calls.comfyui_fit(s.job.job_id, host, s.job.graph, s.priority)
    except ActivityError as err:
        return HostFit(error=agent_silence(err))


def agent_silence(err: ActivityError) -> str:
    """Why a probe got no reading: its agent is down or did not answer in time."""
    cause = err.cause
    return cause.message if isinstance(cause, FailureError) else str(cause or err)


def note_load(s: VideoJobState, load: LoadStatus) -> None:
    """Keeps the latest measurement that explains why the job still waits."""
    s.plan.overflow.last_signal = load
    if load.reachable and s.plan.overflow.trigger == "unreachable":
        s.plan.overflow.trigger = "overloaded"


def last_reachable(s: VideoJobState) -> bool:
    load = s.plan.overflow.last_signal
    return load is None or load.reachable
