"""`spillway submit | status | list | approve | reject | watch` against the real dev server with a
worker running the route stubs: JSON shapes, exit codes, bad input refused before anything
starts, and status of finished jobs without a worker."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import WorkflowHandle
from temporalio.service import RPCError
from temporalio.testing import WorkflowEnvironment

from activities.minimax.activities import CREATE as MINIMAX_CREATE
from spillway.cli import commands
from spillway.client import jobs as job_ops
from spillway.core import names
from spillway.core.models import MAX_PRIORITY_CHANGES, Plan, PriorityChange
from tests.support.cli import one_line, spillway, temporal
from tests.support.constants import CLIP_USD
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import Jobs, RunJobs, history_text
from tests.support.route_stubs import BUSY, FREE, RouteStubs
from tests.support.settings import ARMED, KEY
from tests.support.waiting import until

STATUS_KEYS = {
    "job_id",
    "state",
    "route",
    "reasons",
    "overflow",
    "approval",
    "progress",
    "outputs",
    "cloud",
    "error",
}


@pytest.fixture
def graph_file(tmp_path: Path) -> Path:
    path = tmp_path / "graph.json"
    path.write_text(json.dumps(VIDEO_GRAPH))
    return path


@pytest.fixture
def job_env(cli_env, dev_env: WorkflowEnvironment):
    def make(jobs: Jobs | None = None, **extra: str) -> dict[str, str]:
        queue = jobs.task_queue if jobs else f"nobody-{uuid.uuid4()}"
        address = dev_env.client.service_client.config.target_host
        env: dict[str, str] = cli_env(TEMPORAL_ADDRESS=address, SPILLWAY_TASK_QUEUE=queue, **extra)
        return env

    return make


def new_id() -> str:
    return f"cli-{uuid.uuid4().hex[:10]}"


# A key, the fallback not armed, an hour to decide: a job on a busy A40 waits for a person.
WAITS = KEY | {"APPROVAL_TIMEOUT_S": 3600}


@dataclass
class WaitingJob:
    """A job `spillway submit` started that now waits for approval, with what the CLI needs to
    reach it (`env`), its handle, and the route stubs of its worker."""

    id: str
    env: dict[str, str]
    handle: WorkflowHandle[Any, Plan]
    stubs: RouteStubs
    task_queue: str


@pytest.fixture
def waiting_job(
    run_dev_jobs: RunJobs, job_env, graph_file: Path
) -> Callable[..., AbstractAsyncContextManager[WaitingJob]]:
    """`async with waiting_job(prompt=..., **settings) as job:` a worker with WAITS (and
    `settings`) on a busy A40 and a job submitted to it once it awaits approval; the worker stops
    when the block ends."""

    @asynccontextmanager
    async def start(prompt: str = "x", **settings: Any) -> AsyncIterator[WaitingJob]:
        job_id, stubs = new_id(), RouteStubs(BUSY)
        async with run_dev_jobs(stubs, **WAITS, **settings) as jobs:
            env = job_env(jobs)
            args = ("--graph", str(graph_file), "--job-id", job_id, "--prompt", prompt)
            code, _, err = await spillway("submit", *args, env=env)
            assert code == 0, err
            handle: WorkflowHandle[Any, Plan] = jobs.client.get_workflow_handle(job_id)
            await jobs.until(handle, "awaiting_approval")
            yield WaitingJob(job_id, env, handle, stubs, jobs.task_queue)

    return start


async def assert_never_started(dev_env: WorkflowEnvironment, job_id: str) -> None:
    with pytest.raises(RPCError, match="not found"):
        await dev_env.client.get_workflow_handle(job_id).describe()


@pytest.mark.parametrize(
    ("content", "args", "named"),
    [
        ("{not json", [], "is not JSON"),
        ("[1, 2]", [], "not an API-format ComfyUI graph"),
        ('{"1": {"inputs": {}}}', [], "has no class_type"),
        ("{}", [], "the graph has no nodes"),
        (None, ["--prompt", "x", "--duration", "7"], "not 7 s"),
        (None, ["--prompt", "x", "--resolution", "4K"], "does not render 4K"),
        (None, ["--prompt", "x", "--model", "Sora"], "unknown MiniMax model 'Sora'"),
        (None, ["--prompt", "x" * 2001], "prompt: String should have at most 2000 characters"),
        (None, ["--duration", "10"], "--duration needs --prompt"),
        (None, ["--prompt", " \t "], "the prompt is blank"),
        (None, ["--job-id", "a b;rm -rf /"], "job_id"),
        (None, ["--job-id", "-starts-with-dash"], "--job-id"),
        (None, ["--prompt", "x", "--deadline", "2020-01-01T00:00:00Z"], "has passed"),
        (None, ["--max-wait", "-5m"], "never negative (a value that starts with '-' goes as"),
        (None, ["--max-wait=-5m"], "durations are never negative"),
    ],
)
async def test_bad_input_exits_2_with_one_line_and_starts_nothing(
    job_env, dev_env, tmp_path, graph_file, content, args, named
):
    if content is not None:
        graph_file = tmp_path / "bad.json"
        graph_file.write_text(content)
    job_id = new_id()
    if "--job-id" not in args:
        args = [*args, "--job-id", job_id]
    code, out, err = await spillway("submit", "--graph", str(graph_file), *args, env=job_env())
    assert code == 2 and out == ""
    assert named in one_line(err)
    await assert_never_started(dev_env, job_id)


async def test_a_graph_too_big_for_a_job_is_refused(job_env, dev_env, tmp_path):
    huge = tmp_path / "huge.json"
    node = {"class_type": "EmptyImage", "inputs": {"pad": "x" * 1000}}
    huge.write_text(json.dumps({str(i): node for i in range(10_000)}))  # ~10 MB
    job_id = new_id()
    code, _, err = await spillway("submit", "--graph", str(huge), "--job-id", job_id, env=job_env())
    assert code == 2 and "more than the 1.5 MB a job can carry" in one_line(err)
    await assert_never_started(dev_env, job_id)


async def test_missing_graph_file_exits_2(job_env, tmp_path):
    code, _, err = await spillway("submit", "--graph", str(tmp_path / "nope.json"), env=job_env())
    assert code == 2 and "cannot read graph" in one_line(err)


async def test_submit_then_status_of_the_finished_job_without_a_worker(
    run_dev_jobs: RunJobs, job_env, graph_file
):
    job_id = new_id()
    async with run_dev_jobs(RouteStubs(FREE)) as jobs:
        code, out, err = await spillway(
            "submit", "--graph", str(graph_file), "--job-id", job_id, "--wait", "--json",
            env=job_env(jobs),
        )  # fmt: skip
        assert code == 0, err
        assert json.loads(out)["state"] == "completed"
        env = job_env(jobs)
    # The worker is gone now.
    code, out, err = await spillway("status", job_id, "--json", env=env)
    assert code == 0, err
    status = json.loads(out)
    assert set(status) >= STATUS_KEYS
    assert (status["job_id"], status["state"], status["route"]) == (job_id, "completed", "local")
    assert set(status["overflow"]) == {"trigger", "last_signal"}
    assert set(status["outputs"][0]) == {"path", "bytes", "sha256"}


async def test_submit_without_wait_prints_the_job_id_and_state(
    run_dev_jobs: RunJobs, job_env, graph_file
):
    async with run_dev_jobs(RouteStubs(FREE)) as jobs:
        code, out, _ = await spillway(
            "submit", "--graph", str(graph_file), "--json", env=job_env(jobs)
        )
        assert code == 0
        submitted = json.loads(out)
        assert submitted["state"] == "probing" and submitted["job_id"].startswith("job-")
        code, out, _ = await spillway("watch", submitted["job_id"], env=job_env(jobs))
    assert code == 0 and f"job {submitted['job_id']}: completed" in out


async def test_an_existing_job_id_is_refused_with_exit_1(run_dev_jobs, job_env, graph_file):
    job_id = new_id()
    async with run_dev_jobs(RouteStubs(FREE)) as jobs:
        args = ("submit", "--graph", str(graph_file), "--job-id", job_id, "--wait")
        assert (await spillway(*args, env=job_env(jobs)))[0] == 0
        code, _, err = await spillway(*args, env=job_env(jobs))
    assert code == 1 and f"job {job_id} already exists" in one_line(err)


async def test_waiting_job_shows_why_in_status_list_and_the_ui_then_approve_sends_it_to_cloud(
    waiting_job,
):
    async with waiting_job(prompt="a lighthouse") as job:
        code, out, _ = await spillway("status", job.id, "--json", env=job.env)
        status = json.loads(out)
        assert (
            status["state"] == "awaiting_approval" and status["overflow"]["trigger"] == "overloaded"
        )
        assert status["overflow"]["last_signal"]["reasons"] == BUSY.reasons

        code, out, _ = await spillway("list", "--state", "awaiting_approval", "--json", env=job.env)
        listed = {j["job_id"]: j for j in json.loads(out)}
        assert listed[job.id]["state"] == "awaiting_approval" and listed[job.id]["route"] is None
        assert set(listed[job.id]) == {"job_id", "state", "route", "started", "host", "priority"}
        assert listed[job.id]["priority"] == 3  # the default

        # The Temporal UI's "current details", read with the real temporal CLI.
        details = await temporal_metadata(job.env, job.id)
        assert "Waiting for approval" in details and BUSY.reasons[0] in details
        assert f"spillway approve {job.id}" in details

        code, out, err = await spillway(
            "approve", job.id, "--by", "bär", "--reason", "deadline", env=job.env
        )
        assert code == 0 and "approved" in out, err
        code, out, _ = await spillway("watch", job.id, env=job.env)
        assert code == 0

        code, out, _ = await spillway("status", job.id, "--json", env=job.env)
        status = json.loads(out)
    assert (status["state"], status["route"]) == ("completed", "cloud")
    assert status["approval"]["by"] == "bär" and status["approval"]["reason"] == "deadline"
    assert status["cloud"]["task_id"] == f"task-{job.id}"
    assert status["cloud"]["estimated_cost_usd"] == CLIP_USD
    assert job.stubs.calls[MINIMAX_CREATE] == 1


async def temporal_metadata(env: dict[str, str], job_id: str) -> str:
    out = await temporal(env, "workflow", "metadata", "--workflow-id", job_id, "--output", "json")
    details: str = json.loads(out)["queryResult"][0]["currentDetails"]
    return details


async def test_approving_a_job_that_is_not_waiting_exits_1_with_the_reason(
    run_dev_jobs, job_env, graph_file
):
    job_id = new_id()
    async with run_dev_jobs(RouteStubs(FREE)) as jobs:
        env = job_env(jobs)
        args = ("submit", "--graph", str(graph_file), "--job-id", job_id, "--wait")
        assert (await spillway(*args, env=env))[0] == 0
        code, _, err = await spillway("approve", job_id, "--by", "bär", env=env)
    assert code == 1
    assert f"job {job_id} is not awaiting approval (state: completed)" in one_line(err)


async def test_unknown_job_exits_1(job_env):
    for args in (
        ["status", "no-such-job"],
        ["approve", "no-such-job", "--by", "x"],
        ["cancel", "no-such-job", "--by", "x"],
    ):
        code, _, err = await spillway(*args, env=job_env())
        assert code == 1 and "job no-such-job not found" in one_line(err)


async def test_a_failed_job_is_a_failed_execution_whose_message_status_shows(
    run_dev_jobs, job_env, graph_file
):
    from temporalio.exceptions import ApplicationError

    stubs = RouteStubs(FREE)
    message = "ComfyUI rejected the graph: node 2 (SaveVideo): Required input is missing: video"
    stubs.fail[names.COMFYUI_SUBMIT] = ApplicationError(message, non_retryable=True)
    job_id = new_id()
    async with run_dev_jobs(stubs) as jobs:
        env = job_env(jobs)
        args = ("submit", "--graph", str(graph_file), "--job-id", job_id, "--wait")
        code, out, _ = await spillway(*args, env=env)
        assert code == 1 and message in out
        description = await jobs.client.get_workflow_handle(job_id).describe()
    assert description.status is not None and description.status.name == "FAILED"
    code, out, _ = await spillway("status", job_id, "--json", env=env)
    status: dict[str, Any] = json.loads(out)
    assert (status["state"], status["error"]) == ("failed", message)
    code, out, _ = await spillway("list", "--state", "failed", "--json", env=env)
    assert job_id in {j["job_id"] for j in json.loads(out)}


async def test_armed_job_status_never_shows_the_key(run_dev_jobs, job_env, graph_file):
    key = "mm-" + uuid.uuid4().hex
    job_id = new_id()
    async with run_dev_jobs(RouteStubs(BUSY), **ARMED | {"MINIMAX_API_KEY": key}) as jobs:
        env = job_env(jobs)
        args = ("submit", "--graph", str(graph_file), "--job-id", job_id, "--prompt", "x")
        assert (await spillway(*args, "--wait", env=env))[0] == 0
        _, out, _ = await spillway("status", job_id, "--json", env=env)
        history = await jobs.client.get_workflow_handle(job_id).fetch_history()
    assert json.loads(out)["cloud"]["authorised_by"] == "armed"
    assert key not in out and key not in history_text(history)


async def test_the_ui_signal_with_plain_json_rejects_a_waiting_job(waiting_job):
    # What the Temporal UI's "Send a Signal" sends: the signal name and a JSON object.
    async with waiting_job() as job:
        await temporal(
            job.env, "workflow", "signal", "--workflow-id", job.id, "--name", "approval",
            "--input", '{"approved": false, "by": "ui-user", "reason": "too expensive"}',
        )  # fmt: skip
        code, out, _ = await spillway("watch", job.id, env=job.env)
        summary = await (await job.handle.describe()).static_summary()
    assert code == 0 and "completed on the local route" in out
    assert "rejected by ui-user" in out and "too expensive" in out
    assert summary is not None and summary.startswith(f"video job {job.id}: 3 nodes")
    assert job.stubs.calls[MINIMAX_CREATE] == 0


async def test_with_the_secret_the_ui_signal_cannot_spend_and_a_signed_approve_spends_once(
    waiting_job,
):
    secret = "approval-" + uuid.uuid4().hex
    async with waiting_job(SPILLWAY_APPROVAL_SECRET=secret) as job:
        await temporal(
            job.env, "workflow", "signal", "--workflow-id", job.id, "--name", "approval",
            "--input", '{"approved": true, "by": "ui-user"}',
        )  # fmt: skip
        refused = await until(
            lambda: job.handle.query(names.PLAN_QUERY, result_type=Plan),
            lambda plan: bool(plan.ignored_signals),
        )
        assert refused.state == "awaiting_approval"
        code, out, err = await spillway("approve", job.id, "--by", "bär", env=job.env)
        assert code == 1 and out == "" and "this one: unsigned" in one_line(err)
        assert job.stubs.calls[MINIMAX_CREATE] == 0

        signing = job.env | {"SPILLWAY_APPROVAL_SECRET": secret}
        code, out, err = await spillway("approve", job.id, "--by", "bär", env=signing)
        assert code == 0 and "approved" in out, err
        code, out, _ = await spillway("watch", job.id, env=job.env)
        assert code == 0 and "completed on the cloud route" in out
        code, out, _ = await spillway("status", job.id, "--json", env=job.env)
        history = history_text(await job.handle.fetch_history())
    status = json.loads(out)
    assert status["approval"]["by"] == "bär" and status["approval"]["signed"] is True
    assert [i["by"] for i in status["ignored_signals"]] == ["ui-user", "bär"]
    assert job.stubs.calls[MINIMAX_CREATE] == 1
    assert secret not in history


async def test_an_approval_without_a_running_worker_is_applied_when_one_starts(
    run_dev_jobs: RunJobs, waiting_job
):
    async with waiting_job() as job:
        pass  # its worker stops, the job still waiting
    code, out, err = await spillway("approve", job.id, "--by", "bär", env=job.env)
    assert code == 0 and "no worker answered" in out, err
    async with run_dev_jobs(job.stubs, task_queue=job.task_queue, **WAITS):
        code, out, _ = await spillway("watch", job.id, env=job.env)
    assert code == 0 and "completed on the cloud route" in out and "approved by bär" in out
    assert job.stubs.calls[MINIMAX_CREATE] == 1


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["--callback-url", "ftp://hooks.example/t0ken-42"], "--callback-url must be an http(s)"),
        (["--callback-url", "hooks.example/t0ken-42"], "--callback-url must be an http(s)"),
        (["--priority", "0"], "--priority: invalid choice"),
        (["--priority", "6"], "--priority: invalid choice"),
    ],
)
async def test_a_bad_callback_url_or_priority_exits_2_and_starts_nothing(
    job_env, dev_env, graph_file, args, named
):
    job_id = new_id()
    code, out, err = await spillway(
        "submit", "--graph", str(graph_file), "--job-id", job_id, *args, env=job_env()
    )
    assert code == 2 and out == ""
    assert named in one_line(err) and "t0ken-42" not in err  # a URL may hold a token
    await assert_never_started(dev_env, job_id)


async def test_priority_and_callback_url_travel_with_the_job_and_list_shows_the_priority(
    run_dev_jobs: RunJobs, job_env, graph_file
):
    job_id = new_id()
    async with run_dev_jobs(RouteStubs(FREE)) as jobs:
        env = job_env(jobs)
        code, out, err = await spillway(
            "submit", "--graph", str(graph_file), "--job-id", job_id, "--priority", "1",
            "--callback-url", "http://127.0.0.1:9/hooks/spillway", "--json", env=env,
        )  # fmt: skip
        assert code == 0, err
        assert json.loads(out) == {"job_id": job_id, "state": "probing"}
        handle = jobs.client.get_workflow_handle(job_id)
        description = await handle.describe()
        code, out, _ = await spillway("list", "--json", env=env)
        code_text, text, _ = await spillway("list", env=env)
        history = await handle.fetch_history()
    [listed] = [j for j in json.loads(out) if j["job_id"] == job_id]
    assert code == 0 and listed["priority"] == 1
    assert code_text == 0 and "PRIO" in text
    assert description.raw_info.priority.priority_key == 1  # Temporal's task priority
    started = history.events[0].workflow_execution_started_event_attributes
    job = json.loads(started.input.payloads[0].data)
    assert (job["priority"], job["callback_url"]) == (1, "http://127.0.0.1:9/hooks/spillway")


async def test_an_input_the_graph_cannot_take_exits_2_and_starts_nothing(
    job_env, dev_env, tmp_path, graph_file
):
    picture = tmp_path / "first-frame.png"
    picture.write_bytes(b"\x89PNG\r\n\x1a\n")
    job_id = new_id()
    code, out, err = await spillway(
        "submit", "--graph", str(graph_file), "--job-id", job_id, "--input", str(picture),
        env=job_env(),
    )  # fmt: skip
    assert code == 2 and out == ""
    assert "--input" in one_line(err)  # the graph has no image loader
    await assert_never_started(dev_env, job_id)


async def test_cancel_records_who_and_why_and_a_job_that_has_ended_refuses_it_naming_its_state(
    waiting_job,
):
    async with waiting_job() as job:
        code, out, err = await spillway(
            "cancel", job.id, "--by", "bär", "--reason", "client withdrew", "--json", env=job.env
        )
        assert code == 0, err
        cancelled = json.loads(out)
        assert cancelled["state"] == "cancelled"
        assert (cancelled["cancelled_by"]["by"], cancelled["cancelled_by"]["reason"]) == (
            "bär",
            "client withdrew",
        )
        code, text, _ = await spillway("status", job.id, env=job.env)
        assert code == 0 and "asked by bär" in text and "client withdrew" in text
        details = await temporal_metadata(job.env, job.id)
        assert "**Cancelled** by bär: client withdrew." in details

        code, _, err = await spillway("cancel", job.id, "--by", "bär", env=job.env)
        assert code == 1 and f"job {job.id} has already ended (cancelled)" in one_line(err)
        code, _, err = await spillway("priority", job.id, "1", "--by", "bär", env=job.env)
        assert code == 1 and f"job {job.id} has already ended (cancelled)" in one_line(err)


async def test_priority_on_a_completed_job_exits_1_naming_its_state(
    run_dev_jobs, job_env, graph_file
):
    job_id = new_id()
    async with run_dev_jobs(RouteStubs(FREE)) as jobs:
        env = job_env(jobs)
        args = ("submit", "--graph", str(graph_file), "--job-id", job_id, "--wait")
        assert (await spillway(*args, env=env))[0] == 0
        code, _, err = await spillway("priority", job_id, "1", "--by", "bär", env=env)
    assert code == 1 and f"job {job_id} has already ended (completed)" in one_line(err)


async def test_a_job_moved_again_and_again_keeps_its_last_priority_changes(
    waiting_job, dev_env: WorkflowEnvironment
):
    """The plan is published as a memo on every change: it keeps the latest changes, and a
    reason too long to keep is refused at the command line (exit 2) before anything is sent."""
    async with waiting_job() as job:
        long = "r" * 1001
        code, out, err = await spillway(
            "priority", job.id, "1", "--by", "bär", "--reason", long, env=job.env
        )
        assert (code, out) == (2, "") and "reason: String should have at most 1000" in one_line(err)
        moves = MAX_PRIORITY_CHANGES + 5
        for n in range(moves):
            change = PriorityChange(priority=1 + n % 5, by="bär", reason=f"move {n} " + "r" * 990)
            await job_ops.set_priority(dev_env.client, job.id, change)
        plan = await job_ops.status(dev_env.client, job.id)
    kept = [c.reason.split()[1] for c in plan.priority_changes]
    assert kept == [str(n) for n in range(5, moves)]
    assert plan.priority_changes[-1].priority == 1 + (moves - 1) % 5


async def test_a_cancel_that_waits_for_a_worker_says_so_on_stderr_then_exits_0(
    run_dev_jobs: RunJobs, waiting_job, monkeypatch
):
    monkeypatch.setattr(commands, "CANCEL_QUIET_S", 0.0)  # what it says after a few seconds
    async with waiting_job() as job:
        pass  # its worker stops, the job still waiting
    cancelling = asyncio.create_task(spillway("cancel", job.id, "--by", "bär", env=job.env))

    async def cancel_asked() -> bool:
        events = (await job.handle.fetch_history()).events
        return any(
            e.HasField("workflow_execution_cancel_requested_event_attributes") for e in events
        )

    await until(cancel_asked, timeout_s=60)
    async with run_dev_jobs(job.stubs, task_queue=job.task_queue, **WAITS):
        code, out, err = await asyncio.wait_for(cancelling, timeout=120)
    assert code == 0, err
    assert "cancel asked; waiting for the job to let go of what it holds" in err
    assert f"job {job.id}: cancelled" in out and "asked by bär" in out
