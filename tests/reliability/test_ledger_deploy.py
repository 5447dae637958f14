"""Scenario 8: a deploy in the middle of a burst of cloud jobs (docs/design.md, "The spend ledger
and the budget": live through deploys). 20 armed jobs on a busy GPU reserve in the spend ledger at
once while the worker process, which also runs the ledger, is SIGKILLed and started again five
times, 2 s apart. 0.4.0's ledger, whose update handlers each awaited a local activity, left a
history no worker could replay after such a restart (`evidence/`): its workflow task failed for
good and every later reservation with it.

Every job completes with exactly one create at MiniMax, except one whose create a kill cut off
between its granted `begin` and its settle: that one fails saying a charge may exist, with at
most one create (money invariant 2: an ambiguous create is never sent again). The ledger holds
every job's spend as what happened (charged with the job's task, or maybe charged) and nothing
still reserved, no run of the ledger has a failed workflow task, and its history replays against
today's code. Run with the workers' workflow cache and without one (`ledger_workers`).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import pytest
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from spillway.core import names
from spillway.core.models import FINAL_STATES, Plan
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.harness import Worker, assert_replay, assert_spend_covers, creates_of
from tests.reliability.test_money import ledger
from tests.support.constants import BUSY_VRAM_PCT, CLIP_USD
from tests.support.jobs import Jobs
from tests.support.waiting import until

JOBS = 20
RESTARTS = 5
APART_S = 2.0  # a deploy's rhythm, not a wait for a condition
TASK_FAILED = EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
UPDATE_ACCEPTED = EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED
LOST_CREATE = "the worker was lost during the call"  # workflows/texts.py, ambiguous_create


async def reservations_arriving(client: Client, task_queue: str) -> bool:
    """The ledger has accepted a reservation: the burst has reached it."""
    handle = client.get_workflow_handle(names.ledger_id(task_queue))
    try:
        async for event in handle.fetch_history_events():
            accepted = event.workflow_execution_update_accepted_event_attributes
            if (
                event.event_type == UPDATE_ACCEPTED
                and accepted.accepted_request.input.name == names.LEDGER_RESERVE
            ):
                return True
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:  # not started yet
            return False
        raise
    return False


async def failed_ledger_tasks(client: Client, task_queue: str) -> list[str]:
    """Every failed workflow task in any run of the ledger (continued as new or not), with its
    cause and message."""
    ledger_id = names.ledger_id(task_queue)
    failures = []
    async for run in client.list_workflows(f"WorkflowId = '{ledger_id}'"):
        handle = client.get_workflow_handle(ledger_id, run_id=run.run_id)
        async for event in handle.fetch_history_events():
            if event.event_type == TASK_FAILED:
                failed = event.workflow_task_failed_event_attributes
                failures.append(
                    f"run {run.run_id} event {event.event_id}: "
                    f"{WorkflowTaskFailedCause.Name(failed.cause)}: {failed.failure.message[:500]}"
                )
    return failures


@contextlib.asynccontextmanager
async def naming_ledger_failures(client: Client, task_queue: str) -> AsyncIterator[None]:
    """A wait that timed out says so together with the ledger's failed workflow tasks, if any
    (a wedged ledger answers nobody: the jobs wait)."""
    try:
        yield
    except AssertionError as waited:
        failed = await failed_ledger_tasks(client, task_queue)
        if not failed:
            raise
        tasks = "\n".join(failed)
        raise AssertionError(f"{waited}\nthe ledger's failed workflow tasks:\n{tasks}") from None


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_worker_killed_and_restarted_five_times_mid_burst_leaves_a_ledger_that_replays(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    worker: Worker = await ledger_workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        APPROVAL_TIMEOUT_S=600,  # an armed job that waited for a person would be a finding
    )
    jobs: Jobs = jobs_on(worker)
    client, queue = jobs.client, worker.task_queue
    texts = [f"deployed mid-burst {n}" for n in range(JOBS)]
    ids = await asyncio.gather(*(jobs.submit(text) for text in texts))
    prompts = dict(zip(ids, texts, strict=True))

    async def plans() -> list[Plan]:
        return list(await asyncio.gather(*map(jobs.status, ids)))

    async with naming_ledger_failures(client, queue):
        await until(lambda: reservations_arriving(client, queue), timeout_s=60)
        for restart in range(RESTARTS):
            if restart:
                await asyncio.sleep(APART_S)
            await worker.kill()
            await worker.start()
        ended = await until(
            plans,
            lambda ps: all(p.state in FINAL_STATES for p in ps),
            timeout_s=180,
            every_s=0.5,
            what=f"all {JOBS} jobs ended",
        )
    failed_tasks = await failed_ledger_tasks(client, queue)
    summary = await ledger(client, queue)

    # A kill between a create's granted `begin` and its settle leaves that create ambiguous
    # (whether its request left, or even got the ledger's answer, is known to no one): the job
    # fails saying a charge may exist and never creates again (money invariant 2). Anything
    # else that is not a completed cloud job means the ledger did not live through the deploy.
    lost = {p.job_id for p in ended if p.state == "failed" and LOST_CREATE in (p.error or "")}
    other = {
        p.job_id: (p.state, p.route, p.error)
        for p in ended
        if p.job_id not in lost and (p.state, p.route) != ("completed", "cloud")
    }
    assert not other, f"jobs that neither completed nor lost their create to a kill: {other}"
    creates = creates_of(minimax, prompts)
    assert {job: n for job, n in creates.items() if job not in lost} == {
        job: 1 for job in ids if job not in lost
    }
    assert all(creates[job] <= 1 for job in lost), {job: creates[job] for job in lost}
    assert minimax.tasks_created == minimax.create_calls == sum(creates.values())
    # Whole, one per line: pytest's repr of a long tuple cuts the entries a failure needs.
    held = "\n".join(e.model_dump_json() for e in summary.entries)
    spent_as_said = f"day {summary.day.model_dump_json()}\nlost {sorted(lost)}\nentries:\n{held}"
    assert_spend_covers(summary, minimax, ended)
    assert summary.day.spent_usd == pytest.approx(JOBS * CLIP_USD), spent_as_said
    assert summary.day.reserved_usd == 0
    entries = {e.job_id: e for e in summary.entries}  # settled ones leave at a continue-as-new
    for plan in ended:
        entry = entries.get(plan.job_id)
        if entry is None:
            continue
        if plan.job_id in lost:
            assert entry.state == "maybe_charged", entry
        else:
            assert plan.cloud is not None
            assert (entry.state, entry.task_id) == ("charged", plan.cloud.task_id), entry
    assert not failed_tasks, "the ledger's failed workflow tasks:\n" + "\n".join(failed_tasks)
    await assert_replay(client, queue)
