"""Scenario 1: a worker process SIGKILLed at the stages tests/test_local_route.py and
tests/test_cloud_route.py do not cover (after the POST, while polling MiniMax, right after the
create answer), then started again: every job completes, ComfyUI saw one POST per prompt_id and
MiniMax at most one create per job.

- before the probe: the worker is frozen the moment it is handed the jobs, then killed;
- while the jobs await approval (one approved while no worker runs, one rejected, one freed);
- while the video is downloading from ComfyUI.
"""

from __future__ import annotations

import json

from temporalio.api.enums.v1 import PendingWorkflowTaskState

from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.harness import (
    Sightings,
    cli,
    creates_of,
    polling,
    posts_of,
)
from tests.support.constants import BUSY_VRAM_PCT, FREE_VRAM_PCT
from tests.support.waiting import until


async def test_a_worker_killed_before_the_probe_leaves_jobs_that_complete_after_restart(
    armed, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    # Armed, so a job that lost track of its probe and went to the cloud would show at MiniMax.
    worker, jobs = armed
    await polling(jobs.client, worker.task_queue)
    worker.freeze()  # its pollers stay connected: the server hands it tasks it cannot run
    texts = [f"before the probe {n}" for n in range(3)]
    ids = [await jobs.submit(text) for text in texts]
    prompts = dict(zip(ids, texts, strict=True))

    async def handed_over() -> bool:
        for job_id in ids:
            described = await jobs.client.get_workflow_handle(job_id).describe()
            task = described.raw_description.pending_workflow_task
            if task.state == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_STARTED:
                return True
        return False

    await until(handed_over, bool)
    await worker.kill()
    assert comfyui.hits["GET /system_stats"] == 0  # frozen: not one probe reached ComfyUI

    await worker.start()
    plans = [await jobs.finished(job_id, timeout_s=60) for job_id in ids]
    assert [(p.state, p.route, p.local_attempts) for p in plans] == [("completed", "local", 1)] * 3
    assert posts_of(comfyui, ids) == dict.fromkeys(ids, 1)
    assert creates_of(minimax, prompts) == dict.fromkeys(ids, 0)


async def test_a_worker_killed_while_jobs_await_approval_keeps_every_decision(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, sightings: Sightings
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    comfyui.execution_s = 0.1
    worker = await workers(
        COMFYUI_URL=comfyui.url, MINIMAX_BASE_URL=minimax.url, APPROVAL_TIMEOUT_S=600
    )
    jobs = jobs_on(worker)
    texts = ["approved while no worker runs", "rejected after the restart", "freed after"]
    ids = [await jobs.submit(text) for text in texts]
    prompts = dict(zip(ids, texts, strict=True))
    approved, rejected, freed = ids
    for job_id in ids:
        await jobs.until(job_id, "awaiting_approval")

    await worker.kill()
    # No worker answers the update: the CLI sends the decision as a signal instead.
    code, out, err = await cli(sightings, "approve", approved, "--by", "owner", env=worker.env)
    assert code == 0 and "no worker answered" in out, err
    code, out, _ = await cli(
        sightings, "list", "--state", "awaiting_approval", "--json", env=worker.env
    )
    assert code == 0 and set(ids) <= {j["job_id"] for j in json.loads(out)}
    await worker.start()
    # The signal sent while no worker ran is applied first; once that job is done the worker
    # surely serves the jobs, so the reject below is answered by the update, not sent as a signal.
    approved_plan = await jobs.finished(approved)
    code, out, err = await cli(sightings, "reject", rejected, "--by", "owner", env=worker.env)
    assert code == 0 and "rejected" in out, err
    plan = await jobs.finished(rejected)
    assert (plan.state, plan.route) == ("completed", "local")
    comfyui.set_vram_used_pct(FREE_VRAM_PCT)

    freed_plan = await jobs.finished(freed)
    assert (approved_plan.state, approved_plan.route) == ("completed", "cloud")
    assert approved_plan.approval is not None and approved_plan.approval.by == "owner"
    assert (freed_plan.state, freed_plan.route) == ("completed", "local")
    assert "headroom_returned" in freed_plan.reasons
    assert creates_of(minimax, prompts) == {approved: 1, rejected: 0, freed: 0}
    assert posts_of(comfyui, ids) == {approved: 0, rejected: 1, freed: 1}


async def test_a_worker_killed_mid_download_fetches_the_whole_video_again_after_restart(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, killed_mid_download
):
    worker = await workers(COMFYUI_URL=comfyui.url, MINIMAX_BASE_URL=minimax.url)
    await killed_mid_download(worker, jobs_on(worker), "killed mid-download")
    assert minimax.create_calls == 0
