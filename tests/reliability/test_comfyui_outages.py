"""Scenario 3: ComfyUI going away, with a real worker process and the ComfyUI double stopped
(connections refused on its port) and started again. A ComfyUI restart mid-job (LOST, one
resubmit) is proven in tests/test_local_route.py.

"A minute" of outage is a few seconds here: the worker re-probes every APPROVAL_RECHECK_S=1 s,
confirms "unreachable" after UNREACHABLE_CONFIRM_S (1 s, or 3 s where the test must act between
the two probes) and gives a person APPROVAL_TIMEOUT_S=3 s to approve.
"""

from __future__ import annotations

from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.harness import creates_of, posts_of, probes


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

    # The approval window closes: a timeout never means "spend"; the job waits for ComfyUI.
    plan = await jobs.until(job_id, "probing")
    assert plan.overflow.trigger == "unreachable" and "approval_timeout" in plan.reasons
    await probes(jobs.client, job_id, at_least=5)  # re-probed, still down
    assert (await jobs.status(job_id)).state == "probing"
    await comfyui.start()

    plan = await jobs.finished(job_id)
    assert (plan.state, plan.route, plan.local_attempts) == ("completed", "local", 1)
    assert "headroom_returned" in plan.reasons
    measured = await probes(jobs.client, job_id)
    assert [p.reachable for p in measured] == [False] * (len(measured) - 1) + [True]
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
