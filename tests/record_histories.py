"""Records the histories the replay test replays: one job per main path of the released
version, run on the time-skipping server with the route stubs, written to
tests/histories/<version>/. A release records its own set; a change between releases that
alters a workflow's commands is patched (docs/operations.md, "Releases and running jobs") and
must replay every released version's histories. Never re-record to make a failing replay pass:

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

from spillway.core import names
from spillway.core.gpu_pool import PoolView
from spillway.core.models import ApprovalDecision, JobInput, VideoJob
from spillway.core.names import APPROVAL_SIGNAL
from spillway.temporal import installed_binary, register_search_attributes
from tests.support.images import I2V_GRAPH
from tests.support.jobs import RunJobs, job_runner
from tests.support.route_stubs import BUSY, FREE, RouteStubs
from tests.support.settings import ARMED, KEY, KLING_ARMED
from tests.support.waiting import until

VERSION = "0.5.0"  # the release whose histories this records
HERE = Path(__file__).parent / "histories" / VERSION
WAIT = KEY | {"APPROVAL_TIMEOUT_S": 900, "APPROVAL_RECHECK_S": 60}


async def record(run_jobs: RunJobs, name: str) -> WorkflowHandle[Any, Any]:
    """One job per main path; the name says which."""
    decision = ApprovalDecision(approved=True, by="bär", reason="client deadline")
    if name == "local":
        async with run_jobs(RouteStubs(FREE)) as jobs:
            handle = await jobs.start(job_id=name)
            await handle.result()
    elif name == "approved-cloud":
        async with run_jobs(RouteStubs(BUSY), **WAIT) as jobs:
            handle = await jobs.start(job_id=name)
            await jobs.until(handle, "awaiting_approval")
            await handle.signal(APPROVAL_SIGNAL, decision)
            await handle.result()
    elif name == "approval-timeout":
        async with run_jobs(RouteStubs(BUSY), **WAIT) as jobs:
            handle = await jobs.start(job_id=name)
            await handle.result()
    elif name == "armed-cloud":
        async with run_jobs(RouteStubs(BUSY), **ARMED) as jobs:
            handle = await jobs.start(job_id=name)
            await handle.result()
    elif name == "budget-over-then-over-budget-approval":
        # Armed, but the budget cannot cover it: waits, a plain approval is refused, then one
        # over the budget sends it to the cloud.
        async with run_jobs(RouteStubs(BUSY), **(WAIT | ARMED), CLOUD_DAILY_BUDGET_USD=0.1) as jobs:
            handle = await jobs.start(job_id=name)
            await jobs.until(handle, "awaiting_approval")
            await handle.signal(APPROVAL_SIGNAL, decision)
            await handle.signal(APPROVAL_SIGNAL, decision.model_copy(update={"over_budget": True}))
            await handle.result()
    elif name == "i2v-priority-callback":
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
                names.VIDEO_JOB, job, id=name, task_queue=jobs.task_queue
            )
            await handle.result()
    elif name == "cancelled-reading-budget":
        stubs = RouteStubs(BUSY)
        stubs.held.add(names.SPEND_VIEW)
        async with run_jobs(stubs, **WAIT) as jobs:
            handle = await jobs.start(job_id=name)
            await until(lambda: names.SPEND_VIEW in stubs.holding)
            await jobs.cancel(handle)
            stubs.release.set()
    elif name == "kling-lost-create-reconciled":
        # The worker running the Kling create vanished; Kling names the task by the run's
        # external_task_id and the job follows it.
        stubs = RouteStubs(BUSY)
        stubs.create_hang, stubs.reconciled = True, "task-kling-made"
        async with run_jobs(stubs, **KLING_ARMED) as jobs:
            handle = await jobs.start(job_id=name)
            await handle.result()
    elif name == "host-lost-armed-cloud":
        # The GPU host went silent under the rendering job for longer than HOST_LOST_AFTER_S:
        # armed, it goes to the cloud.
        stubs = RouteStubs(FREE)
        stubs.silent = 1
        async with run_jobs(stubs, **ARMED) as jobs:
            handle = await jobs.start(job_id=name)
            await handle.result()
    elif name == "create-lost-before-it-began":
        # The worker running the create was starved before the ledger's begin: sent anew.
        stubs = RouteStubs(BUSY)
        stubs.lost_before_begin = 1
        async with run_jobs(stubs, **ARMED, SPILLWAY_HEARTBEAT_TIMEOUT_S=1) as jobs:
            handle = await jobs.start(job_id=name)
            await handle.result()
    elif name == "spend-ledger":
        # The ledger's own history: three armed jobs at once, their reservations, begins and
        # settles queued in its inbox and vetted a batch at a time.
        async with run_jobs(RouteStubs(BUSY), **ARMED) as jobs:
            paid = [await jobs.start(job_id=f"{name}-{n}") for n in range(3)]
            await asyncio.gather(*(job.result() for job in paid))
            handle = jobs.client.get_workflow_handle(names.ledger_id(jobs.task_queue))
    elif name in ("queued-then-local", "gpu-pool"):
        # One place (A40_MAX_JOBS=1): a local-only job holds it while a second waits `queued`
        # in the GPU line, then takes it; "gpu-pool" is the pool's own history of the two.
        stubs = RouteStubs(FREE)
        stubs.wait_release.clear()
        async with run_jobs(stubs, A40_MAX_JOBS=1) as jobs:
            holder = await jobs.start(prompt=None, job_id=f"{name}-holder")
            await jobs.until(holder, "running_local")
            handle = await jobs.start(prompt=None, job_id=name)
            await jobs.until(handle, "queued")
            stubs.wait_release.set()
            await holder.result()
            await handle.result()
            if name == "gpu-pool":
                handle = jobs.client.get_workflow_handle(names.pool_id(jobs.task_queue))
                await until(lambda: _pool_idle(handle))
    else:
        raise SystemExit(f"unknown history {name}; one of {', '.join(NAMES)}")
    return handle


async def _pool_idle(handle: WorkflowHandle[Any, Any]) -> bool:
    view = await handle.query(names.POOL_VIEW, result_type=PoolView)
    return not view.line and not any(h.places for h in view.hosts)


NAMES = (
    "local",
    "approved-cloud",
    "approval-timeout",
    "armed-cloud",
    "budget-over-then-over-budget-approval",
    "i2v-priority-callback",
    "cancelled-reading-budget",
    "kling-lost-create-reconciled",
    "create-lost-before-it-began",
    "host-lost-armed-cloud",
    "spend-ledger",
    "queued-then-local",
    "gpu-pool",
)
# Recorded on the dev server: the time-skipping one answers ACTIVITY_UNKNOWN to cancelling a
# running activity.
ON_DEV_SERVER = {"cancelled-reading-budget"}


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
        HERE.mkdir(parents=True, exist_ok=True)
        (HERE / f"{name}.json").write_text(history.to_json())
        print(f"wrote {HERE / name}.json ({len(history.events)} events)")
        await env.shutdown()


if __name__ == "__main__":
    if len(sys.argv) < 2:
        raise SystemExit(f"usage: python -m tests.record_histories NAME...; names: {NAMES}")
    asyncio.run(main(sys.argv[1:]))
    sys.stdout.flush()
    os._exit(0)  # the SDK's bridge can crash at interpreter shutdown (sdk-python#300)
