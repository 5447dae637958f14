"""Scenario 3: ComfyUI going away, with a real worker process and the ComfyUI double stopped
(connections refused on its port) and started again. A ComfyUI restart mid-job (LOST, one
resubmit) is proven in tests/test_local_route.py.

A host that goes away under a running job (ComfyUI stopped, restarted, or its agent killed) is
noticed and, armed, sends the job to the cloud.

"A minute" of outage is a few seconds here: the GPU pool re-probes every
SPILLWAY_POOL_REPROBE_S=1 s, a job confirms "unreachable" after UNREACHABLE_CONFIRM_S (1 s, or 3 s
where the test must act between the two probes) and gives a person APPROVAL_TIMEOUT_S=3 s.
"""

from __future__ import annotations

import asyncio

import pytest

from spillway.core import names
from spillway.core.models import Plan
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.harness import creates_of, posts_of, probes
from tests.support.jobs import Jobs

# A silent ComfyUI costs each call its whole timeout (30 s a request, 60 s a download by default):
# short here, long enough that a loaded machine's answers still come in time.
SILENT_HOST = {"COMFYUI_REQUEST_TIMEOUT_S": 5, "COMFYUI_DOWNLOAD_TIMEOUT_S": 5}


async def test_comfyui_down_for_a_while_makes_the_job_wait_then_it_runs_locally_when_back(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.execution_s = 0.1
    worker = await workers(  # a key, but the fallback is not armed
        COMFYUI_URL=comfyui.url, MINIMAX_BASE_URL=minimax.url, APPROVAL_TIMEOUT_S=3
    )
    jobs = jobs_on(worker)
    await comfyui.stop()
    job_id = await jobs.submit("comfyui down for a while")

    plan = await jobs.until(job_id, "awaiting_approval")
    assert plan.overflow.trigger == "unreachable"
    assert plan.overflow.last_signal is not None
    assert plan.overflow.last_signal.reasons == ["comfyui_unreachable"]
    first, confirmation = (await probes(jobs.client, job_id))[:2]
    assert not first.reachable and not confirmation.reachable  # two probes before deciding

    # The approval window closes: a timeout never means "spend"; the job waits in the GPU line
    # for ComfyUI, and the GPU pool re-probes the host (one probe for every job that waits).
    plan = await jobs.until(job_id, "queued")
    assert plan.overflow.trigger == "unreachable" and "approval_timeout" in plan.reasons
    pool = names.pool_id(worker.task_queue)
    assert not any(p.reachable for p in await probes(jobs.client, pool, at_least=3))
    assert (await jobs.status(job_id)).state == "queued"
    assert len(await probes(jobs.client, job_id)) == 2  # the job itself probes no more
    await comfyui.start()

    plan = await jobs.finished(job_id)
    assert (plan.state, plan.route, plan.local_attempts) == ("completed", "local", 1)
    assert (await probes(jobs.client, pool))[-1].reachable
    assert posts_of(comfyui, [job_id]) == {job_id: 1}
    assert creates_of(minimax, {job_id: "comfyui down for a while"}) == {job_id: 0}


async def test_a_single_refused_probe_changes_nothing_even_when_armed(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.execution_s = 0.1
    worker = await workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,  # armed: a confirmed outage would go to the cloud
        UNREACHABLE_CONFIRM_S=3,
    )
    jobs = jobs_on(worker)
    await comfyui.stop()
    job_id = await jobs.submit("one refused probe")
    await probes(jobs.client, job_id, at_least=1)
    await comfyui.start()  # back before the confirming probe

    plan = await jobs.finished(job_id)
    assert (plan.state, plan.route, plan.overflow.trigger) == ("completed", "local", None)
    assert [p.reachable for p in await probes(jobs.client, job_id)] == [False, True]
    assert posts_of(comfyui, [job_id]) == {job_id: 1}
    assert minimax.create_calls == 0


# --- a host that goes away under a running job ------------------------------------------------
# HOST_LOST_AFTER_S=3 stands for the minute: the plan shows the silence after 3 s of it.


def silence_shown(plan: Plan) -> bool:
    return any(r.startswith("comfyui_unreachable_since=") for r in plan.reasons)


async def rendering(jobs: Jobs, comfyui: ComfyUISim, prompt: str) -> str:
    job_id = await jobs.submit(prompt)
    plan = await jobs.until(job_id, lambda p: p.state == "running_local")
    assert plan.prompt_id is not None
    await comfyui.wait_until(plan.prompt_id, "running")
    return job_id


@pytest.mark.parametrize("gone", ["stopped", "partitioned"])
async def test_comfyui_gone_mid_render_shows_on_the_plan_and_an_unarmed_job_fails_naming_it(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, gone: str
):
    comfyui.execution_s = 30
    worker = await workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        HOST_LOST_AFTER_S=3,
        **SILENT_HOST,
        # The silence shows from 3 s on, the job fails at 20 s: a loaded machine's status reads
        # still see it rendering, silent, in between (with 10 s, one CI run missed it).
        UNREACHABLE_GIVE_UP_S=20,
    )
    jobs = jobs_on(worker)
    job_id = await rendering(jobs, comfyui, f"comfyui {gone}, not armed")
    if gone == "stopped":  # and kept down
        await comfyui.stop()
    else:
        comfyui.faults["*"] = "hang"

    # Partitioned, the first failed poll ends after the client's timeout.
    plan = await jobs.until(job_id, silence_shown, timeout_s=60)
    # Seen rendering, silent; on a loaded machine the first read may come after the give-up.
    assert plan.state in ("running_local", "failed")
    plan = await jobs.finished(job_id)
    assert plan.state == "failed" and plan.error is not None
    assert "GPU host a40_local" in plan.error and "ComfyUI" in plan.error
    assert "not armed" in plan.error
    assert minimax.create_calls == 0


@pytest.mark.parametrize("gone", ["stopped", "partitioned"])
async def test_comfyui_gone_mid_render_sends_an_armed_job_to_the_cloud_once(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, gone: str
):
    comfyui.execution_s = 30
    worker = await workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        HOST_LOST_AFTER_S=3,
        **SILENT_HOST,
    )
    jobs = jobs_on(worker)
    prompt = f"comfyui {gone}, armed"
    job_id = await rendering(jobs, comfyui, prompt)
    if gone == "stopped":  # refused at once
        await comfyui.stop()
    else:  # not refused but silent, as after a power cut: each poll lasts its whole timeout,
        comfyui.faults["*"] = "hang"  # and the silence still counts from the first

    plan = await jobs.finished(job_id, timeout_s=150)
    assert (plan.state, plan.route, plan.overflow.trigger) == ("completed", "cloud", "unreachable")
    assert silence_shown(plan) and "host_lost=a40_local" in plan.reasons
    assert plan.cloud is not None and plan.cloud.authorised_by == "armed"
    assert creates_of(minimax, {job_id: prompt}) == {job_id: 1}
    assert posts_of(comfyui, [job_id]) == {job_id: 1}


# A host that hangs outside the wait: its ComfyUI accepts the submit's POST /prompt or the
# download's GET /view and never answers (until the client gives up: SILENT_HOST).
HANGS = {"submit": "/prompt", "download": "/view"}


@pytest.mark.parametrize("during", HANGS)
async def test_a_host_hanging_during_a_call_sends_an_armed_job_to_the_cloud_once(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, during: str
):
    comfyui.execution_s = 0.1
    comfyui.faults[HANGS[during]] = "hang"
    worker = await workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        HOST_LOST_AFTER_S=3,
        **SILENT_HOST,
    )
    jobs = jobs_on(worker)
    prompt = f"comfyui hangs during {during}, armed"
    job_id = await jobs.submit(prompt)

    # The first call gives up after the client's timeout: lost 3 s after the request left.
    plan = await jobs.finished(job_id, timeout_s=150)
    assert (plan.state, plan.route, plan.overflow.trigger) == ("completed", "cloud", "unreachable")
    assert silence_shown(plan) and "host_lost=a40_local" in plan.reasons
    assert plan.local_attempts == 1
    assert creates_of(minimax, {job_id: prompt}) == {job_id: 1}
    # The hanging POST never reached ComfyUI's queue; the rendered one did, once.
    assert posts_of(comfyui, [job_id]) == {job_id: 0 if during == "submit" else 1}


@pytest.mark.parametrize("during", HANGS)
async def test_a_host_hanging_during_a_call_fails_an_unarmed_job_naming_the_host(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, during: str
):
    comfyui.execution_s = 0.1
    comfyui.faults[HANGS[during]] = "hang"
    worker = await workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        HOST_LOST_AFTER_S=3,
        **SILENT_HOST,
        # Given up within one hanging call: after it a hanging POST's retry finds the host
        # answering its GETs, and waits for the POST to land before it posts again.
        UNREACHABLE_GIVE_UP_S=4,
    )
    jobs = jobs_on(worker)
    job_id = await jobs.submit(f"comfyui hangs during {during}, not armed")

    plan = await jobs.finished(job_id, timeout_s=150)
    assert plan.state == "failed" and plan.error is not None and silence_shown(plan)
    assert "GPU host a40_local" in plan.error and "not armed" in plan.error
    assert minimax.create_calls == 0


async def test_comfyui_restarted_mid_render_gets_the_prompt_resubmitted_once(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.execution_s = 3
    worker = await workers(  # not armed: the job waits for its host
        COMFYUI_URL=comfyui.url, MINIMAX_BASE_URL=minimax.url, HOST_LOST_AFTER_S=3
    )
    jobs = jobs_on(worker)
    job_id = await rendering(jobs, comfyui, "comfyui restarted")
    restart = asyncio.create_task(comfyui.restart(down_s=6))
    plan = await jobs.until(job_id, silence_shown, timeout_s=30)
    await restart

    plan = await jobs.finished(job_id)
    assert (plan.state, plan.route, plan.local_attempts) == ("completed", "local", 2)
    assert "comfyui_answers_again" in plan.reasons
    [lost] = [r.removeprefix("comfyui_lost_prompt=") for r in plan.reasons if "lost_prompt" in r]
    assert plan.prompt_id is not None and plan.prompt_id != lost
    # The lost prompt resubmitted once: one POST for each.
    assert (comfyui.prompt_posts[lost], comfyui.prompt_posts[plan.prompt_id]) == (1, 1)
    assert minimax.create_calls == 0


async def test_a_dead_agent_mid_render_is_a_lost_host_within_its_bound(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.execution_s = 60
    worker = await workers(
        args=["worker", "--no-agents"],
        MINIMAX_BASE_URL=minimax.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        HOST_LOST_AFTER_S=3,
    )
    agent = await workers(
        args=["agent", "--host", "a40_local"],
        SPILLWAY_TASK_QUEUE=worker.task_queue,
        COMFYUI_URL=comfyui.url,
        HOST_LOST_AFTER_S=3,
    )
    jobs = jobs_on(worker)
    job_id = await rendering(jobs, comfyui, "agent gone")
    await agent.kill()  # and not started again

    plan = await jobs.finished(job_id)
    assert (plan.state, plan.route) == ("completed", "cloud")
    assert silence_shown(plan) and "host_lost=a40_local" in plan.reasons
    assert creates_of(minimax, {job_id: "agent gone"}) == {job_id: 1}
