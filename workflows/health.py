"""SpillwayHealthWorkflow: what `spillway health` asks the workers (docs/design.md, "GPU hosts
and agents"). The policy comes from the worker that serves the main task queue, each host's
reading and what it can run from the agent that serves that host's queue, so the report is the
workers' view, not the CLI's environment. A host whose agent does not pick the probe up within
the probe bound is reported as such."""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError

from workflows import activity_calls as calls
from workflows.measure import agent_silence

with workflow.unsafe.imports_passed_through():
    from spillway.core import names
    from spillway.core.models import HostRef, HostView, WorkersView


@workflow.defn(name=names.HEALTH)
class HealthWorkflow:
    @workflow.run
    async def run(self) -> WorkersView:
        policy = await calls.read_policy("health")
        hosts = await asyncio.gather(*(_look(host) for host in policy.hosts))
        return WorkersView(policy=policy, hosts=list(hosts))


async def _look(host: HostRef) -> HostView:
    view = HostView(name=host.name, task_queue=host.task_queue)
    await asyncio.gather(_load(view, host), _capabilities(view, host))
    return view


async def _load(view: HostView, host: HostRef) -> None:
    try:
        view.load = await calls.probe("health", host)
    except ActivityError as err:
        view.error = f"no agent answered on {host.task_queue} ({agent_silence(err)})"


async def _capabilities(view: HostView, host: HostRef) -> None:
    """What the host can run, as its agent last read it (an empty graph fits anywhere)."""
    try:
        fit = await calls.comfyui_fit("health", host, {})
    except ActivityError as err:
        view.capabilities_error = f"no agent answered on {host.task_queue} ({agent_silence(err)})"
        return
    view.capabilities, view.capabilities_error = fit.host, fit.error
