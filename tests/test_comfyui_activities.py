"""The LOCAL route's activities against the ComfyUI double, over loopback HTTP and WebSocket:
submit once, follow to the end, bring the files home, take a prompt back out of ComfyUI."""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import hashlib
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.client import WorkflowFailureError
from temporalio.exceptions import ActivityError, ApplicationError, RetryState
from temporalio.testing import ActivityEnvironment, WorkflowEnvironment
from temporalio.worker import Worker

from activities.comfyui.activities import ComfyUIActivities, SubmitProgress
from activities.comfyui.models import (
    ComfyUICancel,
    ComfyUICancelled,
    ComfyUIDownload,
    ComfyUIFile,
    ComfyUIFinished,
    ComfyUISubmitted,
    ComfyUIUpload,
    ComfyUIUploaded,
)
from spillway.client.inputs import prepare_inputs
from spillway.core.images import with_inputs
from spillway.core.models import Downloaded, JobInput, Progress
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.comfyui_run import Failure
from tests.support.comfyui import (
    ESCAPING_OUTPUTS,
    ComfyUIDouble,
    submit_new_job,
    submit_new_job_until,
    submit_request,
    wait_request,
)
from tests.support.graphs import ANIMATION_GRAPH, SLOW_GRAPH, VIDEO_GRAPH, graph_without
from tests.support.images import I2V_GRAPH, png
from tests.support.waiting import until
from tests.support.workflows import RenderLocally, SubmitOnce


def new_job() -> str:
    return f"job-{uuid.uuid4().hex[:12]}"


def on_disk(path: Path) -> tuple[int, str]:
    content = path.read_bytes()
    return len(content), hashlib.sha256(content).hexdigest()


async def run_workflow(
    env: WorkflowEnvironment, acts: ComfyUIActivities, workflow: Any, req: Any
) -> Any:
    """One of the tiny workflows (SubmitOnce, RenderLocally) on a worker and queue of its own."""
    task_queue = f"comfyui-{uuid.uuid4()}"
    async with Worker(
        env.client,
        task_queue=task_queue,
        workflows=[SubmitOnce, RenderLocally],
        activities=[acts.submit, acts.wait, acts.download, acts.cancel],
    ):
        return await env.client.execute_workflow(
            workflow, req, id=f"comfyui-{uuid.uuid4()}", task_queue=task_queue
        )


def application_error(failure: WorkflowFailureError) -> ApplicationError:
    """The activity's ApplicationError inside a workflow failure."""
    activity_error = failure.cause
    assert isinstance(activity_error, ActivityError)
    cause = activity_error.cause
    assert isinstance(cause, ApplicationError)
    return cause


# --- the whole route -------------------------------------------------------------------------


async def test_video_job_is_submitted_followed_and_downloaded_with_matching_sha256(
    env: WorkflowEnvironment, comfyui: ComfyUISim, comfyui_activities, comfyui_settings
):
    comfyui.execution_s = 0.3
    comfyui.output_bytes = 3 * 1024 * 1024 + 17  # several chunks and a ragged end
    req = submit_request(new_job(), VIDEO_GRAPH)
    downloaded = await run_workflow(env, comfyui_activities(), RenderLocally.run, req)

    assert isinstance(downloaded, Downloaded)
    [output] = downloaded.outputs
    job_dir = comfyui_settings().SPILLWAY_OUTPUT_DIR.resolve() / req.job_id
    assert Path(output.path) == job_dir / "video" / "job_00001_.mp4"
    assert (output.bytes, output.sha256) == on_disk(Path(output.path))
    assert output.bytes == comfyui.output_bytes
    assert output.sha256 == comfyui.expected_sha256("job_00001_.mp4", "video")
    assert comfyui.prompt_posts[req.prompt_id] == 1
    assert [p.name for p in job_dir.rglob("*")] == ["video", "job_00001_.mp4"]  # no .part left


async def test_download_run_again_keeps_the_completed_files_and_fetches_nothing(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.execution_s = 0
    acts = comfyui_activities()
    graph = ANIMATION_GRAPH | {  # an animation and a video
        "4": {"class_type": "CreateVideo", "inputs": {"images": ["1", 0], "fps": 8.0}},
        "3": VIDEO_GRAPH["3"] | {"inputs": VIDEO_GRAPH["3"]["inputs"] | {"video": ["4", 0]}},
    }
    req = await submit_new_job(acts, graph)
    finished, _ = await run_activity(acts.wait, wait_request(req))
    assert isinstance(finished, ComfyUIFinished) and len(finished.files) == 2

    first, _ = await run_activity(
        acts.download, ComfyUIDownload(job_id=req.job_id, files=finished.files)
    )
    views = comfyui.hits["GET /view"]
    again, heartbeats = await run_activity(
        acts.download, ComfyUIDownload(job_id=req.job_id, files=finished.files)
    )

    assert views == 2
    assert comfyui.hits["GET /view"] == views  # nothing fetched the second time
    assert isinstance(again, Downloaded) and again == first
    assert {p.phase for p in heartbeats if p} <= {"downloaded"}


async def test_dropped_download_leaves_no_file_behind_and_the_retry_completes_it(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.execution_s = 0
    acts = comfyui_activities()
    req = await submit_new_job(acts, VIDEO_GRAPH)
    finished, _ = await run_activity(acts.wait, wait_request(req))
    download = ComfyUIDownload(job_id=req.job_id, files=finished.files)

    comfyui.faults["/view"] = "drop"
    failed, _ = await run_activity(acts.download, download)
    assert isinstance(failed, ApplicationError)
    assert failed.type == "ComfyUIUnavailable" and not failed.non_retryable
    job_dir = acts._settings.SPILLWAY_OUTPUT_DIR / req.job_id
    assert not [p for p in job_dir.rglob("*") if p.is_file()]

    del comfyui.faults["/view"]
    downloaded, _ = await run_activity(acts.download, download)
    assert isinstance(downloaded, Downloaded)
    assert downloaded.outputs[0].sha256 == comfyui.expected_sha256("job_00001_.mp4", "video")


async def test_download_reports_bytes_in_its_heartbeats(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.execution_s = 0
    comfyui.output_bytes = 8 * 1024 * 1024
    acts = comfyui_activities(heartbeat_every_s=0.001)  # beats between the download's chunks
    req = await submit_new_job(acts, VIDEO_GRAPH)
    finished, _ = await run_activity(acts.wait, wait_request(req))
    _, heartbeats = await run_activity(
        acts.download, ComfyUIDownload(job_id=req.job_id, files=finished.files)
    )
    shown = [p for p in heartbeats if p and p.phase == "downloading"]
    assert shown and all(p.node == "job_00001_.mp4" and p.max == 8 << 20 for p in shown)
    assert all(p.value is not None and 0 <= p.value <= 8 << 20 for p in shown)


@pytest.mark.parametrize(("subfolder", "filename"), ESCAPING_OUTPUTS)
async def test_output_names_that_would_leave_the_job_folder_are_refused_before_any_request(
    comfyui: ComfyUISim, comfyui_activities, run_activity, tmp_path, subfolder, filename
):
    bad = ComfyUIFile(node_id="9", kind="images", filename=filename, subfolder=subfolder)
    refused, _ = await run_activity(
        comfyui_activities().download, ComfyUIDownload(job_id="job-1", files=[bad])
    )
    assert isinstance(refused, ApplicationError)
    assert refused.type == "ComfyUIUnsafePath" and refused.non_retryable
    assert comfyui.hits["GET /view"] == 0
    assert not [p for p in tmp_path.rglob("*") if p.is_file()]


async def test_output_comfyui_no_longer_has_fails_without_retry(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    gone = ComfyUIFile(node_id="3", kind="images", filename="job_00009_.mp4", subfolder="video")
    failed, _ = await run_activity(
        comfyui_activities().download, ComfyUIDownload(job_id="job-1", files=[gone])
    )
    assert isinstance(failed, ApplicationError)
    assert failed.type == "ComfyUIOutputMissing" and failed.non_retryable
    assert "video/job_00009_.mp4" in failed.message


# --- submit ----------------------------------------------------------------------------------


async def test_invalid_graph_fails_once_without_retries_naming_node_class_and_reason(
    env: WorkflowEnvironment, comfyui: ComfyUISim, comfyui_activities
):
    req = submit_request(new_job(), graph_without(ANIMATION_GRAPH, "2", "fps"))
    with pytest.raises(WorkflowFailureError) as failure:
        await run_workflow(env, comfyui_activities(), SubmitOnce.run, req)

    activity_error = failure.value.cause
    assert isinstance(activity_error, ActivityError)
    assert activity_error.retry_state == RetryState.NON_RETRYABLE_FAILURE
    rejected = application_error(failure.value)
    assert rejected.type == "ComfyUIGraphRejected" and rejected.non_retryable
    assert rejected.message == (
        "ComfyUI rejected the graph: node 2 (SaveAnimatedWEBP): Required input is missing: fps"
    )
    assert comfyui.prompt_posts[req.prompt_id] == 1
    assert comfyui.hits["POST /prompt"] == 1


async def test_unknown_node_class_is_rejected_naming_the_node_and_its_class(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    graph = {**ANIMATION_GRAPH, "1": {"class_type": "NoSuchNode", "inputs": {}}}
    rejected, _ = await run_activity(comfyui_activities().submit, submit_request(new_job(), graph))
    assert isinstance(rejected, ApplicationError) and rejected.non_retryable
    assert rejected.message == (
        "ComfyUI rejected the graph: node 1 (NoSuchNode): "
        "Cannot execute because node NoSuchNode does not exist."
    )


async def test_graph_without_a_save_node_is_rejected_saying_what_is_missing(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    graph = {"1": ANIMATION_GRAPH["1"]}
    rejected, _ = await run_activity(comfyui_activities().submit, submit_request(new_job(), graph))
    assert isinstance(rejected, ApplicationError) and rejected.type == "ComfyUIGraphRejected"
    assert "Prompt has no outputs" in rejected.message and "SaveVideo" in rejected.message


async def test_graph_accepted_with_node_errors_is_rejected_and_taken_out_of_the_queue(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.pause()  # so the accepted half cannot start before it is taken back
    half_broken = {**ANIMATION_GRAPH, "3": copy.deepcopy(ANIMATION_GRAPH["2"])}
    del half_broken["3"]["inputs"]["fps"]
    req = submit_request(new_job(), half_broken)

    rejected, _ = await run_activity(comfyui_activities().submit, req)

    assert isinstance(rejected, ApplicationError)
    assert rejected.type == "ComfyUIGraphRejected" and rejected.non_retryable
    assert rejected.message.startswith(
        "ComfyUI rejected the graph: node 3 (SaveAnimatedWEBP): Required input is missing: fps"
    )
    assert comfyui.state_of(req.prompt_id) == "unknown"  # the valid half does not run alone
    assert comfyui.prompt_posts[req.prompt_id] == 1


async def test_retried_submit_finding_its_prompt_queued_does_not_post_again(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.pause()
    acts = comfyui_activities()
    req = submit_request(new_job(), VIDEO_GRAPH)
    first, _ = await run_activity(acts.submit, req)
    again, _ = await run_activity(acts.submit, req, attempt=2)
    assert first == ComfyUISubmitted(prompt_id=req.prompt_id, number=0, posted=True)
    assert again == ComfyUISubmitted(prompt_id=req.prompt_id, posted=False)
    assert comfyui.prompt_posts[req.prompt_id] == 1
    assert comfyui.state_of(req.prompt_id) == "pending"


async def test_retried_submit_finding_its_prompt_in_history_does_not_post_again(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.execution_s = 0
    acts = comfyui_activities()
    req = await submit_new_job_until(acts, VIDEO_GRAPH, comfyui, "done")
    again, _ = await run_activity(acts.submit, req, attempt=2)
    assert again == ComfyUISubmitted(prompt_id=req.prompt_id, posted=False)
    assert comfyui.prompt_posts[req.prompt_id] == 1


async def test_submit_whose_answer_was_lost_is_retried_by_temporal_without_a_second_post(
    env: WorkflowEnvironment, comfyui: ComfyUISim, comfyui_activities
):
    comfyui.pause()
    comfyui.lose_prompt_answers = 1  # ComfyUI queues it, the connection drops before the answer
    req = submit_request(new_job(), VIDEO_GRAPH)
    submitted = await run_workflow(env, comfyui_activities(), SubmitOnce.run, req)
    assert submitted == ComfyUISubmitted(prompt_id=req.prompt_id, posted=False)
    assert comfyui.prompt_posts[req.prompt_id] == 1
    assert comfyui.hits["POST /prompt"] == 1


async def test_comfyui_ignoring_the_callers_prompt_id_is_refused_as_unsupported(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    # Older ComfyUIs answer with a prompt_id of their own: retries could no longer find it.
    comfyui.answers["/prompt"] = {"prompt_id": "f00-generated", "number": 3, "node_errors": {}}
    failed, _ = await run_activity(
        comfyui_activities().submit, submit_request(new_job(), VIDEO_GRAPH)
    )
    assert isinstance(failed, ApplicationError)
    assert failed.type == "ComfyUIUnsupported" and failed.non_retryable
    assert comfyui.hits["POST /queue"] == 1  # its prompt is taken back out


async def test_submit_to_a_comfyui_that_refuses_connections_is_retryable(
    comfyui_activities, run_activity, refused_url
):
    acts = comfyui_activities(COMFYUI_URL=refused_url)
    failed, _ = await run_activity(acts.submit, submit_request(new_job(), VIDEO_GRAPH))
    assert isinstance(failed, ApplicationError)
    assert failed.type == "ComfyUIUnavailable" and not failed.non_retryable


async def test_submit_answered_500_is_retryable(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.faults["/prompt"] = "http500"
    failed, _ = await run_activity(
        comfyui_activities().submit, submit_request(new_job(), VIDEO_GRAPH)
    )
    assert isinstance(failed, ApplicationError)
    assert failed.type == "ComfyUIUnavailable" and not failed.non_retryable


async def test_submit_whose_post_lands_after_its_timeout_runs_the_prompt_once(
    env: WorkflowEnvironment, comfyui: ComfyUIDouble, comfyui_activities
):
    # ComfyUI queues the POST only after the client gave up: the retry finds nothing yet, and
    # must give the POST its grace rather than post again.
    comfyui.execution_s = 0
    comfyui.late_prompt_posts, comfyui.late_prompt_s = 1, 1.5
    acts = comfyui_activities(COMFYUI_REQUEST_TIMEOUT_S=0.3, post_grace_s=5.0)
    req = submit_request(new_job(), VIDEO_GRAPH)
    submitted = await run_workflow(env, acts, SubmitOnce.run, req)
    assert submitted == ComfyUISubmitted(prompt_id=req.prompt_id, posted=False)
    await comfyui.wait_until(req.prompt_id, "done")
    assert comfyui.prompt_posts[req.prompt_id] == 1
    assert comfyui.hits["POST /prompt"] == 1


async def test_another_agent_retrying_a_submit_reads_the_unanswered_post_from_its_heartbeat(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.pause()
    comfyui.late_prompt_posts, comfyui.late_prompt_s = 1, 1.0
    req = submit_request(new_job(), VIDEO_GRAPH)
    first = comfyui_activities(COMFYUI_REQUEST_TIMEOUT_S=0.2)
    failed, heartbeats = await run_activity(first.submit, req)
    assert isinstance(failed, ApplicationError) and failed.type == "ComfyUIUnavailable"
    [last] = [b for b in heartbeats if isinstance(b, SubmitProgress)][-1:]
    assert last.phase == "posting" and last.posted_at is not None
    # The attempt's first beat: Temporal's SDK sends that one at once and holds later ones back,
    # so an agent killed mid-POST has told the server already.
    assert heartbeats[0] == last

    # The retry runs on another agent: what it knows comes through Temporal as JSON.
    retry = ActivityEnvironment()
    retry.info = dataclasses.replace(
        retry.info, attempt=2, heartbeat_details=[last.model_dump(mode="json")]
    )
    again = await retry.run(comfyui_activities(post_grace_s=5.0).submit, req)
    assert again == ComfyUISubmitted(prompt_id=req.prompt_id, posted=False)
    assert comfyui.prompt_posts[req.prompt_id] == 1
    assert comfyui.state_of(req.prompt_id) == "pending"


async def test_a_submit_retried_after_comfyui_refused_the_post_posts_at_once(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.faults["/prompt"] = "http500"  # an answer: nothing will be queued later
    acts = comfyui_activities()  # the default grace, a minute
    req = submit_request(new_job(), VIDEO_GRAPH)
    failed, _ = await run_activity(acts.submit, req)
    assert isinstance(failed, ApplicationError) and failed.type == "ComfyUIUnavailable"
    del comfyui.faults["/prompt"]
    async with asyncio.timeout(5):
        again, _ = await run_activity(acts.submit, req)
    assert again == ComfyUISubmitted(prompt_id=req.prompt_id, number=again.number, posted=True)


async def test_submit_posts_under_the_agents_client_id_so_its_one_socket_hears_the_prompt(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.pause()
    acts = comfyui_activities()
    await submit_new_job(acts, VIDEO_GRAPH)
    [item] = comfyui.queue_pending
    assert item[3]["client_id"] == acts.client_id


async def test_a_priority_submit_goes_to_the_front_of_comfyuis_queue(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.pause()
    acts = comfyui_activities()
    later = submit_request(new_job(), VIDEO_GRAPH)
    urgent = submit_request(new_job(), VIDEO_GRAPH).model_copy(update={"front": True})
    await run_activity(acts.submit, later)
    submitted, _ = await run_activity(acts.submit, urgent)
    assert submitted == ComfyUISubmitted(prompt_id=urgent.prompt_id, number=-1, posted=True)
    assert [item[1] for item in comfyui.queue_pending] == [urgent.prompt_id, later.prompt_id]


# --- upload ----------------------------------------------------------------------------------


async def test_an_input_is_uploaded_under_its_content_hash_once_and_the_loader_renders_it(
    comfyui: ComfyUISim, comfyui_activities, comfyui_settings, run_activity, tmp_path
):
    comfyui.execution_s = 0
    acts, data, job_id = comfyui_activities(), png(640, 480), new_job()
    (tmp_path / "start.png").write_bytes(data)
    [item] = await prepare_inputs(
        comfyui_settings(), job_id, I2V_GRAPH, [str(tmp_path / "start.png")], cloud=False
    )
    upload = ComfyUIUpload(job_id=job_id, input=item)
    uploaded, heartbeats = await run_activity(acts.upload, upload)
    again, _ = await run_activity(acts.upload, upload)  # a retried upload

    sha256 = hashlib.sha256(data).hexdigest()
    name = f"spillway/{sha256}.png"
    assert uploaded == again == ComfyUIUploaded(node="1", name=name, sha256=sha256)
    assert comfyui.hits["POST /upload/image"] == 2
    assert comfyui.inputs.files == {name: data}  # one file, under the content's name
    assert heartbeats and {h.phase for h in heartbeats} == {"uploading"}

    # The graph as submitted names a file ComfyUI does not have: refused at POST.
    refused, _ = await run_activity(acts.submit, submit_request(job_id, I2V_GRAPH))
    assert isinstance(refused, ApplicationError) and refused.type == "ComfyUIGraphRejected"
    assert "Invalid image file: placeholder.png" in refused.message
    req = submit_request(job_id, with_inputs(I2V_GRAPH, {uploaded.node: uploaded.name}))
    await run_activity(acts.submit, req)
    finished, _ = await run_activity(acts.wait, wait_request(req))
    assert isinstance(finished, ComfyUIFinished) and finished.outcome == "success"
    assert comfyui.history[req.prompt_id]["prompt"][2]["1"]["inputs"] == {"image": name}


async def test_an_input_at_a_url_is_fetched_and_uploaded_under_its_content_hash(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    data = png(320, 320, shade=9)
    comfyui.inputs.files["elsewhere/frame.png"] = data  # served by /view?type=input
    url = f"{comfyui.url}/view?filename=frame.png&subfolder=elsewhere&type=input"
    item = JobInput(node="1", uri=url)
    uploaded, _ = await run_activity(
        comfyui_activities().upload, ComfyUIUpload(job_id=new_job(), input=item)
    )
    sha256 = hashlib.sha256(data).hexdigest()
    assert uploaded == ComfyUIUploaded(node="1", name=f"spillway/{sha256}.png", sha256=sha256)
    assert comfyui.inputs.files[f"spillway/{sha256}.png"] == data


async def test_an_input_changed_since_submit_or_outside_the_store_is_refused_without_retry(
    comfyui: ComfyUISim, comfyui_activities, comfyui_settings, run_activity, tmp_path
):
    acts, job_id = comfyui_activities(), new_job()
    (tmp_path / "start.png").write_bytes(png(640, 480))
    [item] = await prepare_inputs(
        comfyui_settings(), job_id, I2V_GRAPH, [str(tmp_path / "start.png")], cloud=False
    )
    Path(item.uri.removeprefix("file://")).write_bytes(png(640, 480, shade=1))  # noqa: ASYNC240
    outside = JobInput(node="1", uri=(tmp_path / "start.png").as_uri())
    for bad, says in [(item, "sha256 differs"), (outside, "outside SPILLWAY_OUTPUT_DIR")]:
        failed, _ = await run_activity(acts.upload, ComfyUIUpload(job_id=job_id, input=bad))
        assert isinstance(failed, ApplicationError), failed
        assert failed.type == "ComfyUIInputUnreadable" and failed.non_retryable
        assert says in failed.message
    assert comfyui.hits["POST /upload/image"] == 0 and comfyui.inputs.files == {}


# --- wait ------------------------------------------------------------------------------------


async def test_wait_heartbeats_queued_then_running_with_node_progress(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.execution_s = 1.0
    comfyui.progress_nodes.add("ImageBlur")
    comfyui.progress_steps = 4
    comfyui.pause()
    acts = comfyui_activities()
    req = await submit_new_job(acts, SLOW_GRAPH)
    reads = comfyui.hits["GET /queue"]
    waiting = asyncio.create_task(run_activity(acts.wait, wait_request(req)))
    await until(lambda: comfyui.hits["GET /queue"] > reads, timeout_s=5, every_s=0.005)
    await asyncio.sleep(0.1)  # seen in the queue, and said so
    comfyui.resume()
    finished, heartbeats = await waiting

    assert isinstance(finished, ComfyUIFinished) and finished.outcome == "success"
    progress = [p for p in heartbeats if isinstance(p, Progress)]
    assert progress[0] == Progress(phase="queued")
    assert Progress(phase="running", node="11", value=2, max=4, percent=50.0) in progress
    assert {p.phase for p in progress} == {"queued", "running"}


async def test_wait_keeps_heartbeating_while_nothing_changes(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.pause()
    acts = comfyui_activities()  # heartbeats every 0.05 s here, every 5 s in production
    req = await submit_new_job(acts, VIDEO_GRAPH)
    waiting = asyncio.create_task(run_activity(acts.wait, wait_request(req)))
    await asyncio.sleep(0.6)
    comfyui.execution_s = 0
    comfyui.resume()
    _, heartbeats = await waiting
    queued = [p for p in heartbeats if p == Progress(phase="queued")]
    assert len(queued) >= 5


async def test_wait_returns_every_output_file_with_its_kind(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.execution_s = 0
    graph = {
        **ANIMATION_GRAPH,
        "3": {
            "class_type": "SaveImage",
            "inputs": {"images": ["1", 0], "filename_prefix": "still"},
        },
        "4": {
            "class_type": "VHS_VideoCombine",
            "inputs": {
                "images": ["1", 0],
                "frame_rate": 8,
                "loop_count": 0,
                "filename_prefix": "vhs/clip",
                "format": "video/h264-mp4",
                "pingpong": False,
            },
        },
    }
    graph["1"] = copy.deepcopy(graph["1"])
    graph["1"]["inputs"]["batch_size"] = 2
    acts = comfyui_activities()
    req = await submit_new_job(acts, graph)
    finished, _ = await run_activity(acts.wait, wait_request(req))

    assert isinstance(finished, ComfyUIFinished)
    assert [(f.node_id, f.kind, f.subfolder, f.filename, f.animated) for f in finished.files] == [
        ("2", "images", "anim", "orch_00001_.webp", True),
        ("3", "images", "", "still_00001_.png", False),
        ("3", "images", "", "still_00002_.png", False),
        ("4", "gifs", "vhs", "clip_00001.mp4", True),
    ]


async def test_execution_error_fails_without_retry_carrying_comfyuis_exception_and_node(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.execution_s = 0.05
    comfyui.fail_next()
    acts = comfyui_activities()
    req = await submit_new_job(acts, VIDEO_GRAPH)
    failed, _ = await run_activity(acts.wait, wait_request(req))

    assert isinstance(failed, ApplicationError)
    assert failed.type == "ComfyUIExecutionFailed" and failed.non_retryable
    assert failed.message == (
        "ComfyUI failed in node 3 (SaveVideo): av.error.ExternalError: [Errno 542398533] "
        "Generic error in an external library: 'avcodec_open2(\"libx264\", {})'"
    )
    assert failed.details[0]["node_id"] == "3"


async def test_out_of_memory_in_a_chosen_node_names_that_node(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.execution_s = 0
    acts = comfyui_activities()
    req = submit_request(new_job(), SLOW_GRAPH)
    comfyui.fail_prompt(
        req.prompt_id,
        Failure("Allocation on device", "torch.OutOfMemoryError", node_id="11"),
    )
    await run_activity(acts.submit, req)
    failed, _ = await run_activity(acts.wait, wait_request(req))
    assert isinstance(failed, ApplicationError)
    assert failed.message == (
        "ComfyUI failed in node 11 (ImageBlur): torch.OutOfMemoryError: Allocation on device"
    )


async def test_interrupted_prompt_fails_without_retry_naming_the_node(
    comfyui: ComfyUISim, comfyui_activities, run_activity, http: httpx.AsyncClient
):
    comfyui.execution_s = 1.0
    acts = comfyui_activities()
    req = await submit_new_job(acts, SLOW_GRAPH)
    waiting = asyncio.create_task(run_activity(acts.wait, wait_request(req)))
    await comfyui.wait_until(req.prompt_id, "running")
    # Someone presses "cancel" in ComfyUI's own UI.
    await http.post(f"{comfyui.url}/interrupt", json={"prompt_id": req.prompt_id})
    failed, _ = await waiting

    assert isinstance(failed, ApplicationError)
    assert failed.type == "ComfyUIInterrupted" and failed.non_retryable
    assert failed.message.startswith(f"ComfyUI interrupted prompt {req.prompt_id} at node ")


async def test_socket_going_silent_mid_job_is_finished_by_the_history_poll(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.execution_s = 0.5
    comfyui.ws_silent_after = 4  # greeting, execution_start, ... then nothing more arrives
    acts = comfyui_activities()
    req = await submit_new_job(acts, SLOW_GRAPH)
    finished, _ = await run_activity(acts.wait, wait_request(req))

    assert isinstance(finished, ComfyUIFinished) and finished.outcome == "success"
    assert [f.filename for f in finished.files] == ["s_00001_.webp"]
    assert comfyui.ws_withheld > 0  # execution_success and the final executing never arrived


async def test_wait_started_after_the_prompt_finished_reads_it_from_history(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.execution_s = 0
    acts = comfyui_activities()
    # It finishes while no worker watches.
    req = await submit_new_job_until(acts, VIDEO_GRAPH, comfyui, "done")
    finished, _ = await run_activity(acts.wait, wait_request(req))
    assert isinstance(finished, ComfyUIFinished) and finished.outcome == "success"
    assert [f.filename for f in finished.files] == ["job_00001_.mp4"]


async def test_comfyui_restart_mid_job_reports_the_prompt_lost(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.execution_s = 5.0
    acts = comfyui_activities()
    req = await submit_new_job(acts, SLOW_GRAPH)
    waiting = asyncio.create_task(run_activity(acts.wait, wait_request(req)))
    await comfyui.wait_until(req.prompt_id, "running")
    await comfyui.restart(down_s=0.2)
    finished, _ = await waiting
    assert finished == ComfyUIFinished(prompt_id=req.prompt_id, outcome="lost")


async def test_prompt_missing_from_one_poll_only_is_not_lost(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.pause()
    acts = comfyui_activities(COMFYUI_HISTORY_POLL_S=0.5)
    req = await submit_new_job(acts, VIDEO_GRAPH)
    # One glitched answer: the queue looks empty once while history says `{}`.
    comfyui.answers["/queue"] = {"queue_running": [], "queue_pending": []}
    reads = comfyui.hits["GET /queue"]
    waiting = asyncio.create_task(run_activity(acts.wait, wait_request(req)))
    await until(lambda: comfyui.hits["GET /queue"] > reads, timeout_s=5, every_s=0.005)
    del comfyui.answers["/queue"]
    comfyui.execution_s = 0
    comfyui.resume()
    finished, _ = await waiting
    assert isinstance(finished, ComfyUIFinished) and finished.outcome == "success"


# --- cancel ----------------------------------------------------------------------------------


async def test_cancel_while_pending_deletes_the_prompt_from_the_queue(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.pause()
    acts = comfyui_activities()
    req = await submit_new_job(acts, VIDEO_GRAPH)
    cancelled, _ = await run_activity(acts.cancel, ComfyUICancel(prompt_id=req.prompt_id))
    assert cancelled == ComfyUICancelled(prompt_id=req.prompt_id, was="pending")
    assert comfyui.state_of(req.prompt_id) == "unknown"
    comfyui.resume()
    await asyncio.sleep(0.05)
    assert comfyui.state_of(req.prompt_id) == "unknown"  # it never runs


async def test_cancel_while_running_interrupts_and_returns_once_comfyui_let_go(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    comfyui.execution_s = 1.0
    acts = comfyui_activities()
    req = await submit_new_job_until(acts, SLOW_GRAPH, comfyui, "running")
    cancelled, _ = await run_activity(acts.cancel, ComfyUICancel(prompt_id=req.prompt_id))

    assert cancelled == ComfyUICancelled(prompt_id=req.prompt_id, was="running")
    assert comfyui.state_of(req.prompt_id) == "done"
    status = comfyui.history[req.prompt_id]["status"]
    assert status["status_str"] == "error"
    assert status["messages"][-1][0] == "execution_interrupted"


async def test_cancel_of_a_prompt_comfyui_no_longer_holds_reports_gone(
    comfyui: ComfyUISim, comfyui_activities, run_activity
):
    cancelled, _ = await run_activity(
        comfyui_activities().cancel, ComfyUICancel(prompt_id="spillway-never-submitted-1")
    )
    assert cancelled == ComfyUICancelled(prompt_id="spillway-never-submitted-1", was="gone")
    assert comfyui.hits["POST /queue"] == comfyui.hits["POST /interrupt"] == 0


async def test_cancel_during_a_submit_whose_post_is_still_in_flight_takes_the_prompt_out(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.pause()
    comfyui.late_prompt_posts, comfyui.late_prompt_s = 1, 0.6
    acts = comfyui_activities(post_grace_s=3.0)
    req = submit_request(new_job(), VIDEO_GRAPH)
    submitting = asyncio.create_task(run_activity(acts.submit, req))
    await until(lambda: comfyui.hits["POST /prompt"] == 1, timeout_s=5, every_s=0.005)
    # The job is cancelled now: ComfyUI has the POST but has not queued it yet.
    cancelled, _ = await run_activity(acts.cancel, ComfyUICancel(prompt_id=req.prompt_id))
    await submitting

    assert cancelled == ComfyUICancelled(prompt_id=req.prompt_id, was="pending")
    comfyui.execution_s = 0
    comfyui.resume()
    await asyncio.sleep(0.1)
    assert comfyui.state_of(req.prompt_id) == "unknown"  # it never renders


async def test_cancel_looks_again_a_poll_interval_later_before_calling_a_prompt_gone(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    # Another agent's POST lands just after this agent's first look.
    comfyui.pause()
    comfyui.late_prompt_posts, comfyui.late_prompt_s = 1, 0.4
    req = submit_request(new_job(), VIDEO_GRAPH)
    submitting = asyncio.create_task(run_activity(comfyui_activities().submit, req))
    await until(lambda: comfyui.hits["POST /prompt"] == 1, timeout_s=5, every_s=0.005)
    other_agent = comfyui_activities(COMFYUI_HISTORY_POLL_S=1.0)
    cancelled, _ = await run_activity(other_agent.cancel, ComfyUICancel(prompt_id=req.prompt_id))
    await submitting
    assert cancelled == ComfyUICancelled(prompt_id=req.prompt_id, was="pending")
    assert comfyui.state_of(req.prompt_id) == "unknown"


async def test_cancel_uses_newer_comfyuis_job_cancel_endpoint_when_it_has_one(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.jobs_api = True
    comfyui.pause()
    acts = comfyui_activities()
    req = await submit_new_job(acts, VIDEO_GRAPH)
    cancelled, _ = await run_activity(acts.cancel, ComfyUICancel(prompt_id=req.prompt_id))
    assert cancelled == ComfyUICancelled(prompt_id=req.prompt_id, was="pending")
    assert comfyui.hits[f"POST /api/jobs/{req.prompt_id}/cancel"] == 1
    assert comfyui.hits["POST /queue"] == 0
    assert comfyui.state_of(req.prompt_id) == "unknown"


async def test_cancel_on_comfyui_0_3_64_asks_for_the_job_endpoint_once_then_deletes(
    comfyui: ComfyUIDouble, comfyui_activities, run_activity
):
    comfyui.pause()
    acts = comfyui_activities()
    reqs = [submit_request(new_job(), VIDEO_GRAPH) for _ in range(2)]
    for req in reqs:
        await run_activity(acts.submit, req)
        cancelled, _ = await run_activity(acts.cancel, ComfyUICancel(prompt_id=req.prompt_id))
        assert cancelled == ComfyUICancelled(prompt_id=req.prompt_id, was="pending")
        assert comfyui.state_of(req.prompt_id) == "unknown"
    asked = [path for path in comfyui.hits if path.startswith("POST /api/jobs/")]
    assert asked == [f"POST /api/jobs/{reqs[0].prompt_id}/cancel"]  # a 404: never asked again
    assert comfyui.hits["POST /queue"] == 2
