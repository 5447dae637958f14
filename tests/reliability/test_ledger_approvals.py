"""Scenario 7, approvals (issue 35, item 3): with SPILLWAY_APPROVAL_SECRET on the workers, a
signed approval pays for the create of one job incarnation, one provider and one clip, and the
spend ledger checks it itself, on the decision the job's own history holds. A real worker
process on the session's dev server, creates counted at the MiniMax double, and a raw client:

- a signature replayed onto a new incarnation of the same job id (another prompt, another clip):
  no create;
- a signature sent again to its job after a reset: one create.

A rogue that answers the job's `approval_verify` with "signed" needs the job's workflow tasks
(the SDK runs an activity the workflow schedules on its own queue eagerly, on the worker that
scheduled it): tests/test_signed_approvals.py puts one in the job's worker, the ledger and its
vet as they are.

Each runs twice (`ledger_workers`): with the workers' workflow cache and without one.
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkflowIDReusePolicy

from spillway.client import jobs as client_jobs
from spillway.core import approvals, names
from spillway.core.models import ApprovalDecision, CloudRequest, Plan, VideoJob
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.test_money import ledger
from tests.support.constants import BUSY_VRAM_PCT
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import Jobs, reset_to_first_workflow_task
from workflows.video_job import VideoJobWorkflow

SECRET = "approval-secret-" + uuid.uuid4().hex
OWNER = ApprovalDecision(approved=True, by="owner", reason="client deadline")


async def waiting_for_a_person(
    ledger_workers: Any, comfyui: ComfyUISim, minimax: MiniMaxSim
) -> Any:
    """A worker whose GPU is busy, not armed, with the approval secret: jobs wait for a person."""
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    return await ledger_workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        SPILLWAY_APPROVAL_SECRET=SECRET,
        APPROVAL_TIMEOUT_S=600,
    )


async def shown_for_approval(jobs: Jobs, job_id: str) -> Plan:
    """Waiting, and showing what an approval is for (the provider and the clip)."""

    def shown(plan: Plan) -> bool:
        return plan.state == "awaiting_approval" and bool(plan.budget and plan.budget.provider)

    return await jobs.until(job_id, shown)


async def signed_by_the_owner(client: Client, job_id: str) -> ApprovalDecision:
    """What `spillway approve JOB --by owner` sends, on a machine with the secret."""
    binding = await client_jobs.binding(client, job_id, approved=True)
    return approvals.sign(SECRET, binding, OWNER, datetime.now(UTC))


async def new_incarnation(
    client: Client, task_queue: str, job_id: str, request: CloudRequest
) -> None:
    """The same job id started again after its execution closed (a client may allow it)."""
    job = VideoJob(job_id=job_id, graph=VIDEO_GRAPH, cloud=request)
    await client.start_workflow(
        names.VIDEO_JOB,
        job,
        id=job_id,
        task_queue=task_queue,
        id_reuse_policy=WorkflowIDReusePolicy.ALLOW_DUPLICATE,
    )


async def test_a_signature_replayed_onto_a_new_incarnation_of_the_job_id_creates_nothing(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    worker = await waiting_for_a_person(ledger_workers, comfyui, minimax)
    jobs = jobs_on(worker)
    client, queue = jobs.client, worker.task_queue
    job_id = f"again-{uuid.uuid4().hex[:8]}"
    await jobs.submit("the owner's clip", job_id=job_id)
    await shown_for_approval(jobs, job_id)
    signed = await signed_by_the_owner(client, job_id)
    answer = await client_jobs.decide(client, job_id, signed)
    first = await jobs.until(job_id, "completed")
    assert answer.startswith("approved") and first.route == "cloud"

    # Within the signature's 15 minutes: another prompt, a dearer clip, the same job id.
    dearer = CloudRequest(prompt="someone else's clip", resolution="1080P", duration=6)
    await new_incarnation(client, queue, job_id, dearer)
    await shown_for_approval(jobs, job_id)
    handle = client.get_workflow_handle(job_id)
    await handle.signal(names.APPROVAL_SIGNAL, signed)
    refused = await jobs.until(job_id, lambda p: bool(p.ignored_signals))
    summary = await ledger(client, queue)

    assert "bad signature" in refused.ignored_signals[0].why
    assert refused.state == "awaiting_approval" and refused.approval is None
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
    assert [b["prompt"] for b in minimax.create_bodies] == ["the owner's clip"]
    assert [e.job_id for e in summary.entries] == [job_id]  # the first incarnation's only
    await handle.cancel()


async def test_a_signature_sent_again_to_its_job_after_a_reset_pays_for_one_create(
    ledger_workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    worker = await waiting_for_a_person(ledger_workers, comfyui, minimax)
    jobs = jobs_on(worker)
    client = jobs.client
    job_id = await jobs.submit("approved once")
    await shown_for_approval(jobs, job_id)
    signed = await signed_by_the_owner(client, job_id)
    await client_jobs.decide(client, job_id, signed)
    done = await jobs.until(job_id, "completed")
    assert done.cloud is not None

    new_run = await reset_to_first_workflow_task(client, job_id)
    handle = client.get_workflow_handle_for(VideoJobWorkflow.run, job_id, run_id=new_run)
    await handle.signal(names.APPROVAL_SIGNAL, signed)
    again = await asyncio.wait_for(handle.result(), 60)
    summary = await ledger(client, worker.task_queue)

    assert again.cloud is not None and again.cloud.task_id == done.cloud.task_id
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
    [entry] = [e for e in summary.entries if e.job_id == job_id]
    assert entry.state == "charged" and entry.approval == approvals.digest(signed)
