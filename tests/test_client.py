"""spillway.client, the Python API the CLI itself uses, against the real dev server with a worker
of route stubs: submit, status, wait, approve, reject, list; edge validation that starts nothing;
a job written by hand as another language's SDK sends it (started with the real temporal CLI);
priority in `list`; presigned output URLs. Without a server: what `spillway priority` asks of
Temporal for the priority the UI shows, and what it says when the server cannot."""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from argparse import Namespace
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import httpx
import pytest
from temporalio.api.workflowservice.v1 import UpdateWorkflowExecutionOptionsRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.service import RPCError, RPCStatusCode
from temporalio.testing import WorkflowEnvironment

import spillway.client as client_module
from activities.minimax.activities import CREATE as MINIMAX_CREATE
from activities.storage.opening import presign_outputs
from spillway.client import SpillwayClient, make_decision
from spillway.client import jobs as job_ops
from spillway.core.errors import ConfigError, Failed, JobNotFound
from spillway.core.models import OutputFile, Plan, QueueSpot, plan_json
from tests.support.cli import spillway, temporal
from tests.support.graphs import VIDEO_GRAPH
from tests.support.jobs import PROMPT, Jobs, RunJobs
from tests.support.route_stubs import BUSY, FREE, RouteStubs
from tests.support.settings import KEY, make_settings
from tests.support.waiting import until

TOKEN = "tok-" + uuid.uuid4().hex  # a secret inside a callback URL: never shown in a message


def new_id() -> str:
    return f"api-{uuid.uuid4().hex[:10]}"


def api(jobs: Jobs, **settings: Any) -> SpillwayClient:
    return SpillwayClient(
        jobs.client, settings=make_settings(**settings), task_queue=jobs.task_queue
    )


async def test_submit_wait_status_and_list_through_the_api(run_dev_jobs: RunJobs):
    job_id = new_id()
    seen: list[Plan] = []
    async with run_dev_jobs(RouteStubs(FREE)) as jobs:
        client = api(jobs)
        plan = await client.submit(
            VIDEO_GRAPH, job_id=job_id, priority=1, wait=True, on_progress=seen.append
        )
    assert (plan.job_id, plan.state, plan.route) == (job_id, "completed", "local")
    changes = [(p.state, p.route, p.progress) for p in seen]
    assert changes[-1][0] == "completed" and all(a != b for a, b in pairwise(changes))
    # No worker now: status reads the finished job all the same.
    status = await client.status(job_id)
    assert (status.state, status.outputs) == ("completed", plan.outputs)
    assert all(out.url is None for out in status.outputs)  # a local output has no URL

    listed = await until(
        lambda: client.list("completed"), lambda js: job_id in {j.job_id for j in js}
    )
    [job] = [j for j in listed if j.job_id == job_id]
    assert (job.state, job.route, job.priority) == ("completed", "local", 1)
    assert job_id not in {j.job_id for j in await client.list("awaiting_approval")}


async def test_approve_and_reject_through_the_api(run_dev_jobs: RunJobs):
    stubs = RouteStubs(BUSY)
    async with run_dev_jobs(stubs, **KEY, APPROVAL_TIMEOUT_S=3600) as jobs:
        client = api(jobs)
        to_cloud = (await client.submit(VIDEO_GRAPH, prompt=PROMPT)).job_id
        to_local = (await client.submit(VIDEO_GRAPH, prompt=PROMPT)).job_id
        for job_id in (to_cloud, to_local):
            await jobs.until(job_id, "awaiting_approval")
        assert "approved" in await client.approve(to_cloud, "bär", "client deadline")
        await client.reject(to_local, "bär", "not worth it")
        cloud, local = [await client.wait(j) for j in (to_cloud, to_local)]
        with pytest.raises(Failed, match=r"is not awaiting approval \(state: completed\)"):
            await client.approve(to_cloud, "bär")
    assert (cloud.state, cloud.route, cloud.approval and cloud.approval.by) == (
        "completed",
        "cloud",
        "bär",
    )
    assert (local.state, local.route, local.approval and local.approval.reason) == (
        "completed",
        "local",
        "not worth it",
    )
    assert stubs.calls[MINIMAX_CREATE] == 1


@pytest.mark.parametrize(
    ("kwargs", "named"),
    [
        ({"callback_url": f"ftp://example.com/{TOKEN}"}, "--callback-url must be an http(s) URL"),
        ({"callback_url": f"example.com/{TOKEN}"}, "--callback-url must be an http(s) URL"),
        ({"callback_url": f"https:///{TOKEN}"}, "--callback-url must be an http(s) URL"),
        ({"callback_url": f"https://ex ample.com/{TOKEN}"}, "--callback-url must be an http(s)"),
        ({"callback_url": f"https://example.com:x/{TOKEN}"}, "--callback-url must be an http(s)"),
        ({"priority": 0}, "priority: Input should be greater than or equal to 1"),
        ({"priority": 6}, "priority: Input should be less than or equal to 5"),
        ({"prompt": "x", "duration": 7}, "not 7 s"),
        ({"duration": 10}, "--duration needs --prompt"),
        ({"graph": {"1": {"class_type": "X", "inputs": {"pad": "x" * 1_600_000}}}}, "1.5 MB"),
        ({"graph": {"1": {"inputs": {}}}}, "has no class_type"),
        ({"graph": {"1": {"class_type": "X", "inputs": {"a": {1, 2}}}}}, "cannot be sent as JSON"),
        ({"graph": ["not", "a", "graph"]}, "graph: Input should be a valid dictionary"),
        ({"job_id": "a b"}, "job_id"),
    ],
)
async def test_bad_input_raises_config_error_in_one_line_and_starts_nothing(
    dev_env: WorkflowEnvironment, kwargs: dict[str, Any], named: str
):
    client = SpillwayClient(dev_env.client, settings=make_settings(), task_queue="nobody")
    job_id = kwargs.pop("job_id", new_id())
    graph = kwargs.pop("graph", VIDEO_GRAPH)
    with pytest.raises(ConfigError) as refused:
        await client.submit(graph, job_id=job_id, **kwargs)
    message = str(refused.value)
    assert named in message and "\n" not in message and TOKEN not in message
    with pytest.raises(RPCError, match="not found"):
        await dev_env.client.get_workflow_handle(job_id).describe()


async def test_other_refusals_through_the_api(dev_env: WorkflowEnvironment):
    client = SpillwayClient(dev_env.client, settings=make_settings(), task_queue="nobody")
    with pytest.raises(ConfigError, match="unknown state 'done'"):
        await client.list("done")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="by: String should have at least 1 character"):
        make_decision(True, "")
    with pytest.raises(Failed, match="job no-such-job not found"):
        await client.status("no-such-job")
    with pytest.raises(Failed, match="job no-such-job not found"):
        await client.approve("no-such-job", "bär")
    with pytest.raises(Failed, match="job no-such-job not found"):
        await client.cancel("no-such-job", "bär")


async def test_a_cancel_no_worker_takes_up_says_so_and_stays_asked(dev_env: WorkflowEnvironment):
    client = SpillwayClient(
        dev_env.client, settings=make_settings(), task_queue=f"nobody-{uuid.uuid4()}"
    )
    job_id = (await client.submit(VIDEO_GRAPH)).job_id
    with pytest.raises(ConfigError, match="by: String should have at least 1 character"):
        await client.cancel(job_id, "")
    with pytest.raises(Failed, match=f"job {job_id} still shows probing 1 s after its cancel"):
        await client.cancel(job_id, "bär", within_s=1.0)
    handle = dev_env.client.get_workflow_handle(job_id)
    events = (await handle.fetch_history()).events
    signals = [e.workflow_execution_signaled_event_attributes.signal_name for e in events]
    assert "cancel_note" in signals
    assert any(e.HasField("workflow_execution_cancel_requested_event_attributes") for e in events)
    await handle.terminate("test over")


async def test_a_job_written_by_hand_and_started_with_the_temporal_cli_completes(
    run_dev_jobs: RunJobs, cli_env, dev_env: WorkflowEnvironment, tmp_path: Path
):
    # What another language's SDK sends: workflow type, id = job_id, task queue, the JSON of
    # VideoJob (docs/schema/video-job.json); the priority as Temporal's and in the memo.
    job_id = new_id()
    payload = tmp_path / "job.json"
    payload.write_text(json.dumps({"job_id": job_id, "graph": VIDEO_GRAPH, "priority": 2}))
    address = dev_env.client.service_client.config.target_host
    async with run_dev_jobs(RouteStubs(FREE)) as jobs:
        env = cli_env(TEMPORAL_ADDRESS=address, SPILLWAY_TASK_QUEUE=jobs.task_queue)
        await temporal(
            env, "workflow", "start", "--type", "VideoJobWorkflow", "--task-queue",
            jobs.task_queue, "--workflow-id", job_id, "--input-file", str(payload),
            "--priority-key", "2", "--memo", "priority=2",
        )  # fmt: skip
        # A temporalio Client of one's own, with the SDK's default converter, serves as well.
        own = SpillwayClient(
            await Client.connect(address), settings=make_settings(), task_queue=jobs.task_queue
        )
        plan = await own.wait(job_id)
        code, out, err = await spillway("list", "--json", env=env)
    assert (plan.state, plan.route) == ("completed", "local")
    assert code == 0, err
    [listed] = [j for j in json.loads(out) if j["job_id"] == job_id]
    assert (listed["state"], listed["priority"]) == ("completed", 2)


async def test_status_presigns_outputs_kept_in_object_storage(s3):
    body = b"a finished video"
    key = f"outputs/job-1/{uuid.uuid4().hex}.mp4"
    async with s3.client() as bucket:
        await bucket.put_object(Bucket=s3.bucket, Key=key, Body=body)
    sha = hashlib.sha256(body).hexdigest()
    stored = OutputFile(path=key, bytes=len(body), sha256=sha, uri=f"s3://{s3.bucket}/{key}")
    local = OutputFile(path="/outputs/job-1/b.mp4", bytes=1, sha256=sha)
    plan = Plan(job_id="job-1", state="completed", outputs=[stored, local])

    signed = await presign_outputs(plan, make_settings(**s3.env()))
    url = signed.outputs[0].url
    assert url is not None and signed.outputs[1].url is None
    async with httpx.AsyncClient() as http:
        assert (await http.get(url)).content == body
    assert plan.outputs[0].url is None  # the plan given is left as it was
    printed = json.loads(plan_json(signed))["outputs"]  # what `status --json` prints
    assert (printed[0]["uri"], printed[0]["url"]) == (stored.uri, url)
    assert set(printed[1]) == {"path", "bytes", "sha256"}  # a local output as it always was
    # This machine cannot sign (no output store configured): no URL, and no error.
    unsigned = await presign_outputs(plan, make_settings())
    assert [out.url for out in unsigned.outputs] == [None, None]


async def test_wait_asks_again_for_a_job_the_server_denies_after_showing_it(
    dev_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
):
    """A starved or restarting dev server has answered NOT_FOUND for a job it had just shown
    (`scripts/test.sh --under-load`): `wait` asks again for up to GONE_AFTER_S before it says
    the job is gone; a job it never saw is not found at once. The server's answers are played
    here, since no server can be made to give that one on cue."""
    gone = JobNotFound("job j not found")
    answers: list[Plan | JobNotFound] = []

    async def status(client: Client, job_id: str) -> Plan:
        answer = answers.pop(0) if len(answers) > 1 else answers[0]
        if isinstance(answer, JobNotFound):
            raise answer
        return answer

    monkeypatch.setattr(job_ops, "status", status)
    monkeypatch.setattr(client_module, "POLL_S", 0.01)
    monkeypatch.setattr(client_module, "GONE_AFTER_S", 0.5)
    client = SpillwayClient(dev_env.client, settings=make_settings())

    answers[:] = [
        Plan(job_id="j", state="probing"),
        gone,
        gone,
        Plan(job_id="j", state="completed"),
    ]
    assert (await client.wait("j")).state == "completed"
    answers[:] = [Plan(job_id="j", state="probing"), gone]
    started = asyncio.get_running_loop().time()
    with pytest.raises(JobNotFound):
        await client.wait("j")
    assert asyncio.get_running_loop().time() - started >= 0.5
    answers[:] = [gone]
    with pytest.raises(JobNotFound):
        await client.wait("j")


async def test_a_start_denied_the_namespace_is_asked_again_then_names_the_setting(
    dev_env: WorkflowEnvironment, monkeypatch: pytest.MonkeyPatch
):
    """A dev server starved of CPU has answered a start with `Namespace default is not found`
    (`scripts/test.sh --under-load`): a denied start started nothing, so it is asked again for
    NAMESPACE_GRACE_S; a namespace that is not there is then named, with the setting to check."""
    monkeypatch.setattr(job_ops, "NAMESPACE_GRACE_S", 1.5)
    config = dev_env.client.config()
    config["namespace"] = f"nowhere-{uuid.uuid4().hex[:8]}"
    client = SpillwayClient(Client(**config), settings=make_settings())
    started = asyncio.get_running_loop().time()
    with pytest.raises(Failed, match=r"not found \(asked for 2 s\): is TEMPORAL_NAMESPACE right"):
        await client.submit(VIDEO_GRAPH, job_id=new_id())
    assert asyncio.get_running_loop().time() - started >= 1.5


def test_an_approval_whose_job_ended_first_is_answered_with_the_jobs_end_not_temporals_words():
    # What the server answers when the job's run failed while it used the approval.
    temporal_words = (
        "Workflow Update failed because the Workflow completed before the Update completed."
    )
    assert job_ops.ended_first(temporal_words)
    assert not job_ops.ended_first("job x is not awaiting approval (state: running_cloud)")
    plan = Plan(job_id="x", state="failed", error="MiniMax balance is empty (code 1008)")
    assert job_ops.ended_before_answer("x", plan) == (
        "job x ended (failed) before it answered this decision: MiniMax balance is empty "
        "(code 1008) (spillway status x)"
    )


class OptionsService:
    """The one call `follow_priority` makes, answered as a server answers it: `status` None
    takes the change, otherwise it fails with that status."""

    def __init__(self, status: RPCStatusCode | None, message: str = "") -> None:
        self.status, self.message = status, message
        self.requests: list[UpdateWorkflowExecutionOptionsRequest] = []

    async def update_workflow_execution_options(
        self, request: UpdateWorkflowExecutionOptionsRequest, **_: Any
    ) -> None:
        self.requests.append(request)
        if self.status is not None:
            raise RPCError(self.message, self.status, b"")


def temporal_answering(service: OptionsService) -> Client:
    return cast(
        Client,
        SimpleNamespace(
            namespace="default",
            identity="test",
            data_converter=pydantic_data_converter,
            workflow_service=service,
        ),
    )


async def test_priority_sets_the_workflows_temporal_priority_the_ui_shows():
    service = OptionsService(None)
    assert await job_ops.follow_priority(temporal_answering(service), "job-1", 1) is None
    [request] = service.requests
    assert request.workflow_execution.workflow_id == "job-1"
    assert request.workflow_execution_options.priority.priority_key == 1
    assert list(request.update_mask.paths) == ["priority"]


@pytest.mark.parametrize(
    ("status", "message", "said"),
    [
        (
            RPCStatusCode.UNIMPLEMENTED,
            "Method .../UpdateWorkflowExecutionOptions is unimplemented",
            "this Temporal server cannot change a workflow's priority",
        ),
        (
            RPCStatusCode.PERMISSION_DENIED,
            "Request unauthorized.",
            "Temporal refused to change the workflow's priority (Request unauthorized.)",
        ),
        (RPCStatusCode.NOT_FOUND, "workflow execution already completed", None),
    ],
)
async def test_a_server_that_cannot_follow_a_priority_is_named_and_an_ended_job_is_not(
    status: RPCStatusCode, message: str, said: str | None
):
    note = await job_ops.follow_priority(
        temporal_answering(OptionsService(status, message)), "job-1", 2
    )
    if said is None:
        assert note is None
    else:
        assert note == (
            f"job job-1: {said}; the job and its line use priority 2, the Temporal UI still "
            "shows the one it started with"
        )


async def test_priority_on_a_server_without_the_call_exits_0_and_says_so_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
):
    from spillway.cli import commands

    server = temporal_answering(OptionsService(RPCStatusCode.UNIMPLEMENTED, "unimplemented"))
    moved = QueueSpot(position=1, ahead=0, eta_s=None)

    async def job_moved(*_: Any) -> QueueSpot:
        return moved

    async def spillway_client(*_: Any) -> SpillwayClient:
        return SpillwayClient(server, settings=make_settings(), task_queue="q")

    monkeypatch.setattr(job_ops, "set_priority", job_moved)
    monkeypatch.setattr(commands, "_jobs_client", spillway_client)
    args = Namespace(job="job-1", priority=1, by="producer", reason="")
    assert await commands.cmd_priority(args) == 0
    out, err = capsys.readouterr()
    assert out == "job job-1: priority 1, 1 in line (0 ahead)\n"
    assert err.count("\n") == 1
    assert err.startswith("job job-1: this Temporal server cannot change a workflow's priority")
