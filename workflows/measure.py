"""Measuring in VideoJobWorkflow: every GPU host probed at once, the host with headroom picked
for the LOCAL route, and the latest reading kept on the plan to explain a wait
(docs/design.md, "GPU hosts and agents"). Workflow code."""

from __future__ import annotations

import asyncio

from temporalio import workflow
from temporalio.exceptions import ActivityError, FailureError

from workflows import calls
from workflows.job_base import JobBase
from workflows.patches import PATCH_HOSTS

with workflow.unsafe.imports_passed_through():
    from spillway.host_models import HostRef, LoadStatus, Policy
    from spillway.hosts import no_answer, pick_host


class Measure(JobBase):
    async def _measure(self, policy: Policy) -> LoadStatus:
        """Every GPU host at once; the job takes the one with headroom (docs/design.md, "GPU hosts
        and agents"). A job from before hosts existed reads the policy again to find them."""
        if not self._hosts and self._patched(PATCH_HOSTS):
            self._hosts = (await calls.read_policy(self._job.job_id)).hosts
        if not self._hosts:
            return await calls.probe(self._job.job_id, None)
        readings = await asyncio.gather(*(self._probe(host, policy) for host in self._hosts))
        choice = pick_host({r.host or "": r for r in readings})
        self._next_host = choice.host or choice.fallback
        return choice.load

    async def _probe(self, host: HostRef, policy: Policy) -> LoadStatus:
        try:
            load = await calls.probe(self._job.job_id, host, self._priority)
        except ActivityError as err:
            # Its agent is down or did not answer in time: this probe saw no ComfyUI there.
            cause = err.cause
            why = cause.message if isinstance(cause, FailureError) else str(cause or err)
            load = no_answer(host.name, policy.thresholds, workflow.now(), why)
        return load.model_copy(update={"host": host.name})

    def _note_load(self, load: LoadStatus) -> None:
        """Keeps the latest measurement that explains why the job still waits."""
        self._plan.overflow.last_signal = load
        if load.reachable and self._plan.overflow.trigger == "unreachable":
            self._plan.overflow.trigger = "overloaded"

    def _last_reachable(self) -> bool:
        load = self._plan.overflow.last_signal
        return load is None or load.reachable
