"""Jobs for tests: `Jobs`, the one client tests start jobs with and watch them through, and the
in-process job runner; loaded by conftest.

- `Jobs(client, task_queue)`: `start` starts a job as `spillway submit` does (spillway.jobs) and
  returns its handle, `submit` the same returning its id; `status(job)` reads it; `until(job,
  state)` waits for a state (or any condition on the plan); `finished(job)` for its end. A job
  given by its handle is asked directly (a query: the live plan, a worker must be running); one
  given by its id is read as `spillway status` reads it (no worker needed). `cancel(handle)`
  cancels a job and returns its plan once it ended.
- `run_jobs(stubs, task_queue=None, **settings)` (`run_dev_jobs` on the real dev server): an
  async context with a worker running VideoJobWorkflow and the spend ledger with the route
  stubs and the real policy, approval and spend activities; it yields a `Jobs` on that worker's
  queue.
- `cause_message(failed)`: the message of the ApplicationError a failed job ended with.
- `history_text(history)`: a job's history as text, its payloads decoded.
- `pool_settled(client, task_queue)`: the GPU pool's view once its line is empty and every place
  is free (a give-back frees its place at the holder check that confirms it, just after the job
  ends).
- `reset_to_first_workflow_task(client, job_id)`: what an operator's reset to the job's first
  workflow task does; returns the new run's id.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import httpx
import pytest
from temporalio import activity
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.enums.v1 import EventType
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowFailureError, WorkflowHandle, WorkflowHistory
from temporalio.exceptions import ApplicationError
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

from activities.approvals import ApprovalActivities
from activities.callbacks import CallbackActivities
from activities.policy import PolicyActivities
from activities.pool import PoolActivities
from activities.spend.activities import SpendActivities, SpendRequest
from activities.spend.guard import CreateGuard
from activities.spend.ledger import SpendLedger
from activities.spend.vet import LedgerVetting
from spillway.client import jobs as job_ops
from spillway.client.queue import pool_view
from spillway.core import names
from spillway.core.errors import JobNotFound
from spillway.core.gpu_pool import PoolView
from spillway.core.hosts import WAITS_SUFFIX, gpu_hosts, ref
from spillway.core.ledger import BudgetView, SpendEntry
from spillway.core.models import FINAL_STATES, CloudRequest, JobState, Plan, VideoJob
from spillway.core.tiers import load_tiers
from tests.support.constants import LEDGER_SECRET
from tests.support.graphs import VIDEO_GRAPH
from tests.support.route_stubs import RouteStubs
from tests.support.settings import make_settings
from tests.support.waiting import until
from worker import POOL, WORKFLOWS, announce_budgets
from workflows.video_job import VideoJobWorkflow

PROMPT = "a lighthouse at dusk, slow pan"
Job = str | WorkflowHandle[Any, Plan]
T = TypeVar("T")
# Starts in flight at once in the scale scenarios: hundreds started in one instant timed out on
# a dev server starved by the load check (scripts/test.sh --under-load), and a start that timed
# out may or may not have started its job.
STARTS_AT_ONCE = 20


async def start_all(starts: Iterable[Callable[[], Awaitable[T]]]) -> list[T]:
    """Each of `starts` called and awaited, STARTS_AT_ONCE at a time; their results in order."""
    gate = asyncio.Semaphore(STARTS_AT_ONCE)

    async def one(start: Callable[[], Awaitable[T]]) -> T:
        async with gate:
            return await start()

    return list(await asyncio.gather(*map(one, starts)))


@dataclass
class Jobs:
    client: Client
    task_queue: str
    stubs: RouteStubs | None = None  # the in-process runner's stand-ins
    started: list[str] | None = None  # where every job started is noted, if anywhere

    async def start(
        self,
        prompt: str | None = PROMPT,
        graph: dict[str, Any] = VIDEO_GRAPH,
        job_id: str | None = None,
        priority: int = 3,
    ) -> WorkflowHandle[Any, Plan]:
        """A job with `graph`, and a cloud request for `prompt` unless it is None."""
        job = VideoJob(
            job_id=job_id or f"job-{uuid.uuid4().hex[:12]}",
            graph=graph,
            cloud=CloudRequest(prompt=prompt) if prompt is not None else None,
            priority=priority,
        )
        handle = await job_ops.submit(self.client, job, self.task_queue)
        if self.started is not None:
            self.started.append(job.job_id)
        return handle

    async def submit(
        self,
        prompt: str | None = PROMPT,
        graph: dict[str, Any] = VIDEO_GRAPH,
        job_id: str | None = None,
    ) -> str:
        """`start`, for a test that follows the job by its id, as an operator does."""
        return (await self.start(prompt, graph, job_id)).id

    async def status(self, job: Job) -> Plan:
        if isinstance(job, str):
            return await job_ops.status(self.client, job)
        plan: Plan = await job.query(VideoJobWorkflow.plan)
        return plan

    async def until(
        self, job: Job, want: JobState | Callable[[Plan], bool], timeout_s: float = 60
    ) -> Plan:
        """The plan once the job is in state `want` (or `want(plan)` holds). Polled in real time:
        a time-skipping server does not skip while a test polls."""
        done = want if callable(want) else lambda plan: plan.state == want
        name = job if isinstance(job, str) else job.id

        async def read() -> Plan | None:
            # A starved or restarting dev server can deny a job it has: read again.
            with contextlib.suppress(JobNotFound):
                return await self.status(job)
            return None

        def good(plan: Plan | None) -> bool:
            return plan is not None and bool(done(plan))

        plan = await until(
            read,
            good,
            timeout_s=timeout_s,
            what=f"job {name}: {want}",
        )
        assert plan is not None
        return plan

    async def finished(self, job: Job, timeout_s: float = 90) -> Plan:
        return await self.until(job, lambda plan: plan.state in FINAL_STATES, timeout_s)

    async def cancel(self, job: WorkflowHandle[Any, Plan]) -> Plan:
        """Cancel the job, as `spillway cancel` does; its plan once the cancel has ended it (a
        cancelled job's result is a failure)."""
        await job.cancel()
        with pytest.raises(WorkflowFailureError):
            async with asyncio.timeout(60):  # a swallowed cancel would leave the job waiting
                await job.result()
        return await self.status(job)


def cause_message(failed: pytest.ExceptionInfo[WorkflowFailureError]) -> str:
    cause = failed.value.cause
    assert isinstance(cause, ApplicationError)
    return cause.message


def history_text(history: WorkflowHistory) -> str:
    """The history's JSON with every payload decoded (the JSON holds them as base64), for a
    test that searches it for what must never be there."""
    texts = [history.to_json()]

    def walk(node: object) -> None:
        if isinstance(node, dict):
            data = node.get("data")
            if isinstance(data, str) and "metadata" in node:
                texts.append(base64.b64decode(data).decode("utf-8", errors="replace"))
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    walk(json.loads(texts[0]))
    return "\n".join(texts)


RunJobs = Callable[..., AbstractAsyncContextManager[Jobs]]


def _held_reads(spend: SpendActivities, stubs: RouteStubs) -> list[Callable[..., Any]]:
    """The ledger's reads before a person is asked, which a test may hold running (as a slow
    ledger would) by naming them in `stubs.held`."""

    @activity.defn(name=names.SPEND_VIEW)
    async def view(req: SpendRequest) -> BudgetView:
        await stubs.hold(names.SPEND_VIEW)
        return await spend.view(req)

    @activity.defn(name=names.SPEND_RECORDED)
    async def recorded(req: SpendRequest) -> SpendEntry | None:
        await stubs.hold(names.SPEND_RECORDED)
        return await spend.recorded(req)

    return [view, recorded]


def job_runner(environment: WorkflowEnvironment) -> RunJobs:
    @asynccontextmanager
    async def run(
        stubs: RouteStubs,
        task_queue: str | None = None,
        verify: Callable[..., Any] | None = None,
        **settings: Any,
    ) -> AsyncIterator[Jobs]:
        """`verify`: what answers `approval_verify` on the job's queue instead of spillway's
        own activity (a rogue that can poll that queue)."""
        # The pool re-probes as often as a waiting job of 0.4.0 did: on the time-skipping server
        # every probe of a skipped hour would run for real.
        settings.setdefault("SPILLWAY_POOL_REPROBE_S", 60)
        # As shipped: the ledger is sealed and vetted with the secret, and takes the worker's
        # budget settings when the worker starts.
        settings.setdefault("SPILLWAY_LEDGER_SECRET", LEDGER_SECRET)
        config = make_settings(**settings)
        tiers = load_tiers(config.SPILLWAY_ROUTING_TIERS)
        policy = PolicyActivities(config, tiers)
        task_queue = task_queue or f"jobs-{uuid.uuid4()}"
        ledger = SpendLedger(
            environment.client, task_queue, seal_with=config.SPILLWAY_LEDGER_SECRET
        )
        spend = SpendActivities(ledger, config, tiers)
        places = PoolActivities(environment.client)
        stubs.guard = CreateGuard(ledger, config)
        # The stand-ins serve every queue a job uses: the worker's, its waits queue, and the
        # GPU hosts' agents' queues (docs/design.md, "GPU hosts and agents").
        host_queues = [task_queue + WAITS_SUFFIX]
        for host in gpu_hosts(config, tiers):
            queues = ref(task_queue, host.name)
            host_queues += [queues.task_queue, queues.waits_queue]
        async with contextlib.AsyncExitStack() as stack:
            http = await stack.enter_async_context(httpx.AsyncClient())
            callbacks = CallbackActivities(http, config)
            vetting = LedgerVetting(environment.client, config, tiers)
            for queue in host_queues:
                await stack.enter_async_context(
                    Worker(environment.client, task_queue=queue, activities=stubs.activities())
                )
            await stack.enter_async_context(
                Worker(
                    environment.client,
                    task_queue=task_queue,
                    workflows=WORKFLOWS,
                    activities=[
                        *stubs.activities(),
                        policy.read_policy,
                        verify or ApprovalActivities(config).verify,
                        spend.reserve,
                        spend.settle,
                        *_held_reads(spend, stubs),
                        callbacks.job_callback,
                        places.start,
                        places.start_by_leave,
                    ],
                )
            )
            await stack.enter_async_context(
                Worker(
                    environment.client,
                    task_queue=names.vet_queue(task_queue),
                    activities=[vetting.vet],
                )
            )
            await stack.enter_async_context(
                Worker(
                    environment.client,
                    task_queue=names.pool_queue(task_queue),
                    workflows=[POOL],
                    activities=[
                        policy.read_policy,
                        places.check_holders,
                        places.find_holders,
                        places.read_places,
                    ],
                )
            )
            await announce_budgets(ledger, config)
            jobs = Jobs(environment.client, task_queue, stubs, started=[])
            try:
                yield jobs
            finally:
                if environment.supports_time_skipping:
                    await _end_left_behind(environment.client, task_queue, jobs.started or [])

    return run


async def _end_left_behind(client: Client, task_queue: str, job_ids: list[str]) -> None:
    """The test server skips no time while any workflow has a task no worker will pick up: a job
    a test left waiting (its timers fire in a later test's skipped hours) or its pool (probes on
    queues nobody serves) would stall every test after it. Ended while the workers still run."""

    async def end(workflow_id: str) -> None:
        with contextlib.suppress(RPCError):
            await client.get_workflow_handle(workflow_id).terminate("test over")

    await asyncio.gather(*(end(job_id) for job_id in job_ids))
    await end(names.pool_id(task_queue))


@pytest.fixture
def run_jobs(env: WorkflowEnvironment) -> RunJobs:
    """A worker on the switchable `env` (time-skipping by default)."""
    return job_runner(env)


@pytest.fixture
def run_dev_jobs(dev_env: WorkflowEnvironment) -> RunJobs:
    """A worker on the real dev server (visibility: lists, metadata, the temporal CLI)."""
    return job_runner(dev_env)


async def pool_settled(client: Client, task_queue: str) -> PoolView:
    return await until(
        lambda: pool_view(client, task_queue),
        lambda v: not v.line and not any(h.places for h in v.hosts),
        what="the GPU pool's line empty and every place free",
    )


async def reset_to_first_workflow_task(client: Client, job_id: str) -> str:
    handle = client.get_workflow_handle(job_id)
    history = await handle.fetch_history()
    first = next(
        e.event_id
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED
    )
    run_id = (await handle.describe()).run_id
    reset = await client.workflow_service.reset_workflow_execution(
        ResetWorkflowExecutionRequest(
            namespace=client.namespace,
            workflow_execution=WorkflowExecution(workflow_id=job_id, run_id=run_id),
            reason="test: an operator resets a job",
            workflow_task_finish_event_id=first,
            request_id=str(uuid.uuid4()),
        )
    )
    assert reset.run_id != run_id
    return reset.run_id
