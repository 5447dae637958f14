"""Records the histories the replay test replays: one job per main path, run on the
time-skipping server with the route stubs. Record a new path, or re-record one only on purpose
(a deliberate, versioned change of the workflow), never to make a failing replay pass:

    .venv/bin/python -m tests.record_histories NAME...
"""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path
from typing import Any

from temporalio.client import WorkflowHandle
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.testing import WorkflowEnvironment

from spillway import activity_names as names
from spillway.models import ApprovalDecision, JobInput, VideoJob
from spillway.temporal import installed_binary, register_search_attributes
from tests.support.images import I2V_GRAPH
from tests.support.jobs import RunJobs, job_runner
from tests.support.route_stubs import BUSY, FREE, RouteStubs
from tests.support.settings import ARMED, KEY, KLING_ARMED
from tests.support.waiting import until
from workflows.video_job import APPROVAL_SIGNAL

HERE = Path(__file__).parent / "histories"
WAIT = KEY | {"APPROVAL_TIMEOUT_S": 900, "APPROVAL_RECHECK_S": 60}


async def record(run_jobs: RunJobs, name: str) -> WorkflowHandle[Any, Any]:
    """One job per main path; the name says which."""
    decision = ApprovalDecision(approved=True, by="bär", reason="client deadline")
    if name in (
        "replay-local",
        "replay-local-published-at-start",
        "replay-local-policy-here",
        "replay-local-patch-floor",
    ):
        async with run_jobs(RouteStubs(FREE)) as jobs:
            handle = await jobs.start(job_id=name)
            await handle.result()
    elif name in (
        "replay-approved-cloud",
        "replay-ledger-approved-cloud",
        "replay-approved-asks-ledger-first",
        "replay-approved-patch-floor",
    ):
        async with run_jobs(RouteStubs(BUSY), **WAIT) as jobs:
            handle = await jobs.start(job_id=name)
            await jobs.until(handle, "awaiting_approval")
            await handle.signal(APPROVAL_SIGNAL, decision)
            await handle.result()
    elif name == "replay-approval-timeout":
        async with run_jobs(RouteStubs(BUSY), **WAIT) as jobs:
            handle = await jobs.start(job_id=name)
            await handle.result()
    elif name == "replay-ledger-armed-cloud":
        async with run_jobs(RouteStubs(BUSY), **ARMED) as jobs:
            handle = await jobs.start(job_id=name)
            await handle.result()
    elif name == "replay-ledger-budget-over":
        # Armed, but the budget cannot cover it: waits, a plain approval is refused, then one
        # over the budget sends it to the cloud.
        async with run_jobs(RouteStubs(BUSY), **(WAIT | ARMED), CLOUD_DAILY_BUDGET_USD=0.1) as jobs:
            handle = await jobs.start(job_id=name)
            await jobs.until(handle, "awaiting_approval")
            await handle.signal(APPROVAL_SIGNAL, decision)
            await handle.signal(APPROVAL_SIGNAL, decision.model_copy(update={"over_budget": True}))
            await handle.result()
    elif name == "replay-i2v-priority-callback":
        # An image input uploaded to the GPU host, priority 1 (front of ComfyUI's queue), and
        # the job.completed callback started as the job ends.
        job = VideoJob(
            job_id=name,
            graph=I2V_GRAPH,
            inputs=[JobInput(node="1", uri="s3://bucket/in/start.png", sha256="a" * 64)],
            callback_url="http://127.0.0.1:9/hook",
            priority=1,
        )
        async with run_jobs(RouteStubs(FREE)) as jobs:
            handle = await jobs.client.start_workflow(
                "VideoJobWorkflow", job, id=name, task_queue=jobs.task_queue
            )
            await handle.result()
    elif name == "replay-cancelled-reading-budget":
        stubs = RouteStubs(BUSY)
        stubs.held.add(names.SPEND_VIEW)
        async with run_jobs(stubs, **WAIT) as jobs:
            handle = await jobs.start(job_id=name)
            await until(lambda: names.SPEND_VIEW in stubs.holding)
            await jobs.cancel(handle)
            stubs.release.set()
    elif name == "replay-kling-lost-create-reconciled":
        # The worker running the Kling create vanished; Kling names the task by the run's
        # external_task_id and the job follows it.
        stubs = RouteStubs(BUSY)
        stubs.create_hang, stubs.reconciled = True, "task-kling-made"
        async with run_jobs(stubs, **KLING_ARMED) as jobs:
            handle = await jobs.start(job_id=name)
            await handle.result()
    else:
        raise SystemExit(f"unknown history {name}; one of {', '.join(NAMES)}")
    return handle


# The first three were recorded before the spend ledger existed and replay through its patches.
NAMES = (
    "replay-local",
    "replay-approved-cloud",
    "replay-approval-timeout",
    "replay-ledger-armed-cloud",
    "replay-ledger-approved-cloud",
    "replay-ledger-budget-over",
    "replay-i2v-priority-callback",
    # Since a job asks the ledger for a create of its own before it asks a person.
    "replay-approved-asks-ledger-first",
    # Since spillway's client starts a job with its first publication (no upsert before the
    # policy read).
    "replay-local-published-at-start",
    # Since a job reads the policy as a local activity (patch policy-read-as-local-activity).
    "replay-local-policy-here",
    # Since a cancel that meets a ledger read ends the job (patch
    # cancel-not-swallowed-by-ledger-reads).
    "replay-cancelled-reading-budget",
    # Since a Kling create whose worker was lost is reconciled by its external_task_id (patch
    # reconcile-lost-kling-create).
    "replay-kling-lost-create-reconciled",
    # Since a new run records one marker for every patch (workflows/patches.py, PATCH_FLOOR).
    "replay-local-patch-floor",
    "replay-approved-patch-floor",
)
# Recorded on the dev server: the time-skipping one answers ACTIVITY_UNKNOWN to cancelling a
# running activity.
ON_DEV_SERVER = {"replay-cancelled-reading-budget"}


async def main(names: list[str]) -> None:
    for name in names:
        if name in ON_DEV_SERVER:
            env = await WorkflowEnvironment.start_local(
                data_converter=pydantic_data_converter,
                dev_server_existing_path=installed_binary("temporal"),
            )
        else:
            env = await WorkflowEnvironment.start_time_skipping(
                data_converter=pydantic_data_converter,
                test_server_existing_path=installed_binary("temporal-test-server"),
            )
        await register_search_attributes(env.client)
        handle = await record(job_runner(env), name)
        history = await handle.fetch_history()
        (HERE / f"{name}.json").write_text(history.to_json())
        print(f"wrote {HERE / name}.json ({len(history.events)} events)")
        await env.shutdown()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(f"usage: python -m tests.record_histories NAME...; names: {NAMES}")
    asyncio.run(main(sys.argv[1:]))
    sys.stdout.flush()
    os._exit(0)  # the SDK's bridge can crash at interpreter shutdown (sdk-python#300)
