"""A one-step workflow that runs the `a40_load_status` activity by its registered name, so the
tests see the measurement travel through Temporal (converter, history) as VideoJobWorkflow will."""

from __future__ import annotations

from datetime import timedelta

from temporalio import workflow

with workflow.unsafe.imports_passed_through():
    from spillway.models import LoadProbeRequest, LoadStatus


@workflow.defn
class ProbeOnce:
    @workflow.run
    async def run(self, req: LoadProbeRequest) -> LoadStatus:
        status: LoadStatus = await workflow.execute_activity(
            "a40_load_status",
            req,
            result_type=LoadStatus,
            start_to_close_timeout=timedelta(seconds=30),
        )
        return status
