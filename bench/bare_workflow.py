"""The baseline of bench/comfyui_route.py: a workflow that runs N no-op activities in a row, the
first of them as a local activity, as a job reads its policy."""

from __future__ import annotations

from datetime import timedelta

from temporalio import activity, workflow


@activity.defn(name="bench_noop")
async def noop(step: int) -> int:
    return step


@workflow.defn(name="BareWorkflow")
class BareWorkflow:
    @workflow.run
    async def run(self, steps: int) -> None:
        timeout = timedelta(seconds=30)
        await workflow.execute_local_activity(noop, 0, start_to_close_timeout=timeout)
        for step in range(1, steps):
            await workflow.execute_activity(noop, step, start_to_close_timeout=timeout)
