"""Records the histories the replay test replays: one job per main path, run on the
time-skipping server with the route stubs. Re-record only on purpose (a deliberate, versioned
change of the workflow), never to make a failing replay pass:

    .venv/bin/python -m tests.record_histories
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from spillway.models import ApprovalDecision
from spillway.temporal import installed_binary, register_search_attributes
from tests.job_fixtures import _runner
from tests.route_stubs import BUSY, FREE, RouteStubs
from workflows.video_job import APPROVAL_SIGNAL

HERE = Path(__file__).parent / "histories"
WAIT = {"MINIMAX_API_KEY": "mm-test-key", "APPROVAL_TIMEOUT_S": 900, "APPROVAL_RECHECK_S": 60}


async def main() -> None:
    env = await WorkflowEnvironment.start_time_skipping(
        data_converter=pydantic_data_converter,
        test_server_existing_path=installed_binary("temporal-test-server"),
    )
    await register_search_attributes(env.client)
    run_jobs = _runner(env)
    async with run_jobs(RouteStubs(FREE)) as jobs:
        local = await jobs.start(job_id="replay-local")
        await local.result()
    async with run_jobs(RouteStubs(BUSY), **WAIT) as jobs:
        approved = await jobs.start(job_id="replay-approved-cloud")
        await jobs.until(approved, "awaiting_approval")
        decision = ApprovalDecision(approved=True, by="bär", reason="client deadline")
        await approved.signal(APPROVAL_SIGNAL, decision)
        await approved.result()
    async with run_jobs(RouteStubs(BUSY), **WAIT) as jobs:
        timed_out = await jobs.start(job_id="replay-approval-timeout")
        await timed_out.result()
    for handle in (local, approved, timed_out):
        history = await handle.fetch_history()
        (HERE / f"{handle.id}.json").write_text(history.to_json())
        print(f"wrote {HERE / handle.id}.json ({len(history.events)} events)")
    await env.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
    sys.stdout.flush()
    os._exit(0)  # the SDK's bridge can crash at interpreter shutdown (sdk-python#300)
