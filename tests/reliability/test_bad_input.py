"""Scenario 5: bad input at the edges tests/test_cli_jobs.py does not cover (there: malformed and
10 MB graphs, a job id with a space and a semicolon, an existing job id). Each gives a clear
error or a fail-open reading with its reason, never a crash of the worker process (a following
good job completes on it) and never a cloud call the job was not entitled to.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.service import RPCError

from activities.minimax.activities import POLL as MINIMAX_POLL
from spillway.core import names
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.guard import GuardSim
from spillway.sim.minimax import CREATE_PATH, QUERY_PATH, MiniMaxSim
from tests.reliability.harness import DevServer, Sightings, Worker, cli, probes
from tests.support.cli import one_line
from tests.support.comfyui import posts_for, prompts_of
from tests.support.constants import BUSY_VRAM_PCT, FREE_VRAM_PCT
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import Jobs
from tests.support.waiting import until

HTML = "<html><body>502 Bad Gateway</body></html>"  # what SimServer's "html" fault answers


async def a_good_job_still_completes(worker: Worker, jobs: Jobs) -> None:
    assert worker.running, f"the worker process died:\n{worker.log}"
    plan = await jobs.finished(await jobs.submit(None))
    assert (plan.state, plan.route) == ("completed", "local")


async def pending_failure(client: Client, job_id: str, activity: str, attempts: int) -> str:
    """The last failure of a job's running activity once it has been tried `attempts` times:
    what `temporal workflow describe` and the UI's pending activities show."""

    async def failure() -> str | None:
        described = await client.get_workflow_handle(job_id).describe()
        for pending in described.raw_description.pending_activities:
            if pending.activity_type.name == activity and pending.attempt > attempts:
                return pending.last_failure.message
        return None

    what = f"{activity} of job {job_id} tried {attempts} times"
    message: str | None = await until(failure, lambda m: m is not None, every_s=0.1, what=what)
    assert message is not None
    return message


async def test_prompts_and_save_names_with_unicode_and_shell_metacharacters_arrive_unchanged(
    armed, comfyui: ComfyUISim, minimax: MiniMaxSim, sightings: Sightings, tmp_path: Path
):
    worker, _ = armed
    pwned = tmp_path / "pwned"
    prompt = (
        f"Straße im Nebel, 夜の灯台 🌊 — \"quoted\" 'single' $(touch {pwned}) `touch {pwned}`; "
        f"touch {pwned} && echo $HOME | cat > {pwned} <<EOF\n\\n %s {{0}} \x1b[31m"
    )
    name = "ジョブ $(id);`id`|&<>'\"🎬"
    graph = json.loads(json.dumps(VIDEO_GRAPH))
    graph["3"]["inputs"]["filename_prefix"] = f"vidéo/{name}"
    graph_file = tmp_path / "graph €.json"
    graph_file.write_text(json.dumps(graph, ensure_ascii=False), encoding="utf-8")
    submit = ("submit", "--graph", str(graph_file), "--prompt", prompt, "--wait", "--json")

    code, out, err = await cli(sightings, *submit, env=worker.env)  # the A40 is free: local
    assert code == 0, err
    local = json.loads(out)
    [video] = local["outputs"]
    assert Path(video["path"]).name == f"{name}_00001_.mp4"
    assert Path(video["path"]).parent.name == "vidéo"
    assert video["sha256"] == comfyui.expected_sha256(f"{name}_00001_.mp4", "vidéo")

    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)  # busy and armed: the cloud
    code, out, err = await cli(sightings, *submit, env=worker.env)
    assert code == 0, err
    assert (json.loads(out)["state"], json.loads(out)["route"]) == ("completed", "cloud")
    assert [body["prompt"] for body in minimax.create_bodies] == [prompt]
    assert not pwned.exists()  # nothing anywhere ran the prompt through a shell
    assert worker.running


@pytest.mark.parametrize(
    "job_id",
    [
        "jöb-1",
        "ジョブ",
        "job-🎬",
        "job$(id)",
        "job`id`",
        "job;ls",
        "job|cat",
        "job&&id",
        "../etc",
        "job/../../x",
        "job\nsecond-line",
        " job",
        "a" * 101,
    ],
)
async def test_job_ids_with_unicode_or_shell_metacharacters_are_refused_before_anything_starts(
    cli_env, temporal_server: DevServer, sightings: Sightings, tmp_path: Path, job_id: str
):
    graph_file = tmp_path / "graph.json"
    graph_file.write_text(json.dumps(VIDEO_GRAPH))
    env = cli_env(TEMPORAL_ADDRESS=temporal_server.address)
    code, out, err = await cli(
        sightings, "submit", "--graph", str(graph_file), "--job-id", job_id, env=env
    )
    assert (code, out) == (2, "")
    assert "job_id" in one_line(err) or "--job-id" in one_line(err)
    with pytest.raises(RPCError, match="not found"):
        await temporal_server.client.get_workflow_handle(job_id).describe()


async def test_comfyui_answering_html_to_the_submit_is_retried_with_the_reason_and_posted_once(
    armed, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    worker, jobs = armed
    comfyui.faults["/prompt"] = "html"  # a proxy in front of ComfyUI answering its error page
    job_id = await jobs.submit("html to the submit")

    failure = await pending_failure(jobs.client, job_id, names.COMFYUI_SUBMIT, attempts=2)
    assert failure == f"ComfyUI: POST /prompt answered 200 {HTML!r}"
    assert (await jobs.status(job_id)).state == "running_local"
    del comfyui.faults["/prompt"]

    plan = await jobs.finished(job_id)
    assert (plan.state, plan.route, plan.local_attempts) == ("completed", "local", 1)
    assert posts_for(comfyui, job_id) == 1
    assert comfyui.hits["POST /prompt"] >= 3  # two HTML pages, then the one real POST
    await a_good_job_still_completes(worker, jobs)
    assert minimax.create_calls == 0


async def test_comfyui_answering_html_to_the_history_poll_is_never_taken_for_a_lost_prompt(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    comfyui.execution_s = 0.3
    worker = await workers(COMFYUI_URL=comfyui.url, MINIMAX_BASE_URL=minimax.url)
    jobs = jobs_on(worker)
    job_id = await jobs.submit("html to the history poll")
    await until(lambda: posts_for(comfyui, job_id) == 1, timeout_s=30)
    [prompt] = prompts_of(comfyui, job_id)
    history = f"/history/{prompt}"
    comfyui.faults[history] = "html"

    await comfyui.wait_until(prompt, "done")
    seen = comfyui.hits[f"GET {history}"]
    await until(lambda: comfyui.hits[f"GET {history}"] >= seen + 3, timeout_s=30)
    assert (await jobs.status(job_id)).state == "running_local"
    said = f"reading the history of prompt {prompt}: ComfyUI: GET /history answered 200 {HTML!r}"
    assert said in worker.log
    del comfyui.faults[history]

    plan = await jobs.finished(job_id)
    assert (plan.state, plan.route, plan.local_attempts) == ("completed", "local", 1)
    assert not any(r.startswith("comfyui_lost_prompt") for r in plan.reasons)
    assert comfyui.prompt_posts[prompt] == 1
    await a_good_job_still_completes(worker, jobs)
    assert minimax.create_calls == 0


@pytest.fixture
def busy_and_armed(armed: tuple[Worker, Jobs], comfyui: ComfyUISim) -> tuple[Worker, Jobs]:
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    return armed


async def test_minimax_answering_html_with_200_while_polling_is_retried_and_never_recreated(
    busy_and_armed, comfyui: ComfyUISim, minimax: MiniMaxSim
):
    worker, jobs = busy_and_armed
    minimax.faults[QUERY_PATH] = "html"
    job_id = await jobs.submit("html while polling")

    failure = await pending_failure(jobs.client, job_id, MINIMAX_POLL, attempts=2)
    assert failure == f"MiniMax query answer is not MiniMax's ({HTML!r})"
    assert (await jobs.status(job_id)).state == "running_cloud"
    del minimax.faults[QUERY_PATH]

    plan = await jobs.finished(job_id)
    assert (plan.state, plan.route) == ("completed", "cloud")
    assert (minimax.create_calls, minimax.tasks_created) == (1, 1)
    comfyui.set_vram_used_pct(FREE_VRAM_PCT)
    await a_good_job_still_completes(worker, jobs)
    assert minimax.create_calls == 1


async def test_minimax_answering_html_with_200_to_the_create_fails_saying_a_charge_may_exist(
    busy_and_armed, minimax: MiniMaxSim
):
    worker, jobs = busy_and_armed
    minimax.faults[CREATE_PATH] = "html"
    job_id = await jobs.submit("html to the create")

    plan = await jobs.finished(job_id)
    assert (plan.state, plan.route) == ("failed", "cloud")
    assert plan.error is not None and "is not a MiniMax answer" in plan.error
    assert "a charge may exist" in plan.error and "will not create again" in plan.error
    assert minimax.create_calls == 1  # ambiguous: never sent again
    del minimax.faults[CREATE_PATH]

    assert worker.running
    plan = await jobs.finished(await jobs.submit("the next job"))
    assert (plan.state, plan.route) == ("completed", "cloud")
    assert minimax.create_calls == 2  # one per job


async def test_a_guard_answering_busy_yes_reads_as_not_busy_with_the_reason(
    workers, jobs_on, comfyui: ComfyUISim, minimax: MiniMaxSim, guard: GuardSim, sightings
):
    comfyui.execution_s = 0.1
    guard.status = {"busy": "yes", "job": "sim_video_job_123"}
    worker = await workers(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        A40_GUARD_URL=guard.url,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,  # armed: a guard taken for busy would cost money
    )
    jobs = jobs_on(worker)
    job_id = await jobs.submit("guard says yes")

    plan = await jobs.finished(job_id)
    assert (plan.state, plan.route, plan.overflow.trigger) == ("completed", "local", None)
    [load] = await probes(jobs.client, job_id)
    reason = "guard: unexpected answer (busy: Input should be a valid boolean)"
    assert (load.overloaded, load.guard_busy) == (False, None) and reason in load.errors
    assert reason in worker.log
    code, out, err = await cli(sightings, "load", "--json", env=worker.env)
    assert code == 0, err
    assert json.loads(out)["overloaded"] is False and reason in json.loads(out)["errors"]
    await a_good_job_still_completes(worker, jobs)
    assert minimax.create_calls == 0
