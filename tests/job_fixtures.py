"""A worker running VideoJobWorkflow and the spend ledger with the route stubs and the real
policy and spend activities, and a small client for starting jobs and watching their plan.
Loaded by conftest."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any

import pytest
from temporalio.client import Client, WorkflowHandle
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.policy import PolicyActivities
from activities.spend import CreateGuard, SpendActivities, SpendLedger
from spillway.models import CloudRequest, JobState, Plan, VideoJob
from spillway.settings import Settings
from spillway.tiers import load_tiers
from tests.comfyui_fixtures import VIDEO_GRAPH
from tests.route_stubs import RouteStubs
from worker import WORKFLOWS
from workflows.video_job import VideoJobWorkflow

# The recorded transcripts' model-free video graph: EmptyImage -> CreateVideo -> SaveVideo.
GRAPH = VIDEO_GRAPH
# Settings a test did not choose: nothing armed, no key, nothing read from this process's env.
QUIET = {
    "CLOUD_VIDEO_FALLBACK_ENABLED": False,
    "MINIMAX_API_KEY": None,
    "APPROVAL_WEBHOOK_URL": None,
    "A40_GUARD_URL": None,
}
ARMED = {"CLOUD_VIDEO_FALLBACK_ENABLED": True, "MINIMAX_API_KEY": "mm-test-key"}


@dataclass
class Jobs:
    client: Client
    task_queue: str
    stubs: RouteStubs

    async def start(
        self, job_id: str | None = None, cloud: bool = True
    ) -> WorkflowHandle[Any, Plan]:
        job = VideoJob(
            job_id=job_id or f"job-{uuid.uuid4().hex[:12]}",
            graph=GRAPH,
            cloud=CloudRequest(prompt="a lighthouse at dusk, slow pan") if cloud else None,
        )
        return await self.client.start_workflow(
            VideoJobWorkflow.run, job, id=job.job_id, task_queue=self.task_queue
        )

    async def until(self, handle: WorkflowHandle[Any, Plan], state: JobState) -> Plan:
        """Polls the plan (real time; a time-skipping server does not skip while we poll)."""
        for _ in range(200):
            plan: Plan = await handle.query(VideoJobWorkflow.plan)
            if plan.state == state:
                return plan
            await asyncio.sleep(0.05)
        raise AssertionError(f"job never reached {state}; last plan: {plan}")


RunJobs = Callable[..., AbstractAsyncContextManager[Jobs]]


def _runner(environment: WorkflowEnvironment) -> RunJobs:
    @asynccontextmanager
    async def run(
        stubs: RouteStubs, task_queue: str | None = None, **settings: Any
    ) -> AsyncIterator[Jobs]:
        config = Settings(**(QUIET | settings))
        tiers = load_tiers(config.SPILLWAY_ROUTING_TIERS)
        policy = PolicyActivities(config, tiers)
        task_queue = task_queue or f"jobs-{uuid.uuid4()}"
        ledger = SpendLedger(environment.client, task_queue)
        spend = SpendActivities(ledger, config, tiers)
        stubs.guard = CreateGuard(ledger, config)
        async with Worker(
            environment.client,
            task_queue=task_queue,
            workflows=WORKFLOWS,
            activities=[
                *stubs.activities(),
                policy.read_policy,
                spend.reserve,
                spend.settle,
                spend.view,
            ],
        ):
            yield Jobs(environment.client, task_queue, stubs)

    return run


@pytest.fixture
def run_jobs(env: WorkflowEnvironment) -> RunJobs:
    """A worker on the switchable `env` (time-skipping by default)."""
    return _runner(env)


@pytest.fixture
def run_dev_jobs(dev_env: WorkflowEnvironment) -> RunJobs:
    """A worker on the real dev server (visibility: lists, metadata, the temporal CLI)."""
    return _runner(dev_env)
