"""Scenario 8: a GPU host's agent killed while it renders and while it downloads (docs/design.md,
"GPU hosts and agents"). The worker runs apart (`spillway worker --no-agents`), the agent as its
own process (`spillway agent --host a40_local`), as on a GPU host: SIGKILLed, then started
again, the job completes with its whole video and ComfyUI saw one POST for its prompt."""

from __future__ import annotations

from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.reliability.harness import posts_of

AGENT = ["agent", "--host", "a40_local"]


async def test_an_agent_killed_mid_render_picks_the_wait_up_again_after_restart(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.execution_s = 6  # long enough to be caught rendering
    worker = await workers(args=["worker", "--no-agents"], MINIMAX_BASE_URL=minimax.url)
    agent = await workers(
        args=AGENT, SPILLWAY_TASK_QUEUE=worker.task_queue, COMFYUI_URL=comfyui.url
    )
    jobs = jobs_on(worker)
    job_id = await jobs.submit("agent killed mid-render")
    plan = await jobs.until(job_id, lambda p: p.state == "running_local")
    assert plan.prompt_id is not None
    await comfyui.wait_until(plan.prompt_id, "running")
    await agent.kill()
    await agent.start()

    plan = await jobs.finished(job_id)
    assert (plan.state, plan.route, plan.local_attempts) == ("completed", "local", 1)
    assert plan.host == "a40_local"
    assert posts_of(comfyui, [job_id]) == {job_id: 1}
    assert minimax.create_calls == 0


async def test_an_agent_killed_mid_download_fetches_the_whole_video_after_restart(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, killed_mid_download
):
    worker = await workers(args=["worker", "--no-agents"], MINIMAX_BASE_URL=minimax.url)
    agent = await workers(
        args=AGENT, SPILLWAY_TASK_QUEUE=worker.task_queue, COMFYUI_URL=comfyui.url
    )
    await killed_mid_download(agent, jobs_on(worker), "agent killed mid-download")
