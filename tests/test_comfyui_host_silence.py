"""Submit, upload and download under the host-lost rule (activities/comfyui/silence.py): an
attempt that gets no answer hands on since when the host is silent, and the call ends with
HOST_SILENT once that silence reaches its report_silence_after_s, against the ComfyUI double
hanging or dropping connections."""

from __future__ import annotations

import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from temporalio.exceptions import ApplicationError

from activities.comfyui.activities import SubmitProgress
from activities.comfyui.models import (
    HOST_SILENT,
    UNAVAILABLE,
    ComfyUICancel,
    ComfyUIDownload,
    ComfyUIFile,
    ComfyUIUpload,
    Silence,
)
from activities.comfyui.silence import Retried
from spillway.client.inputs import prepare_inputs
from tests.support.activity import run_activity
from tests.support.comfyui import ComfyUIDouble, submit_request
from tests.support.graphs import VIDEO_GRAPH
from tests.support.images import I2V_GRAPH, png

AN_HOUR_AGO = datetime.now(UTC) - timedelta(hours=1)
OUTPUT = ComfyUIFile(node_id="9", kind="videos", filename="job_00001_.mp4")


def new_job() -> str:
    return f"job-{uuid.uuid4().hex[:12]}"


def failure(result: object) -> ApplicationError:
    assert isinstance(result, ApplicationError), result
    return result


async def test_a_submit_to_a_partitioned_host_hands_its_silence_on_then_ends_host_silent(
    comfyui: ComfyUIDouble, comfyui_activities
):
    comfyui.faults["*"] = "hang"  # connections accepted, never answered
    acts = comfyui_activities(COMFYUI_REQUEST_TIMEOUT_S=0.2)
    req = submit_request(new_job(), VIDEO_GRAPH).model_copy(update={"report_silence_after_s": 60.0})
    before = time.time()
    first, beats = await run_activity(acts.submit, req)
    assert failure(first).type == UNAVAILABLE and not failure(first).non_retryable
    last = beats[-1]
    assert isinstance(last, SubmitProgress) and last.posted_at is not None
    # Silent since its POST left, not since the timeout ended it.
    assert last.silent_since is not None
    assert before <= last.silent_since.timestamp() <= last.posted_at.timestamp() + 0.05

    # The next attempt (another agent: what it knows came through Temporal as JSON) goes on
    # counting from there, and ends the call once the silence is as long as asked.
    again = req.model_copy(update={"report_silence_after_s": 0.3})
    carried = [last.model_dump(mode="json")]
    other = comfyui_activities(COMFYUI_REQUEST_TIMEOUT_S=0.2)
    second, _ = await run_activity(other.submit, again, attempt=2, heartbeat_details=carried)
    silent = failure(second)
    assert silent.type == HOST_SILENT and silent.non_retryable
    handed_on = Silence.model_validate(silent.details[0])
    assert handed_on == Silence(silent_since=last.silent_since, posted_at=last.posted_at)
    assert comfyui.prompt_posts[req.prompt_id] == 0


async def test_a_submit_called_again_after_a_silence_looks_before_posting(
    comfyui: ComfyUIDouble, comfyui_activities
):
    req = submit_request(new_job(), VIDEO_GRAPH)
    await run_activity(comfyui_activities().submit, req)  # its POST landed; the answer did not
    # The workflow's next call: attempt 1 of a new activity, with the silence it was told of.
    again = req.model_copy(update={"report_silence_after_s": 30.0, "silent_since": AN_HOUR_AGO})
    submitted, _ = await run_activity(comfyui_activities().submit, again)
    assert submitted.posted is False
    assert comfyui.prompt_posts[req.prompt_id] == 1


async def test_a_download_the_workflow_knows_is_silent_ends_at_the_first_unanswered_attempt(
    comfyui: ComfyUIDouble, comfyui_activities
):
    comfyui.faults["/view"] = "drop"
    download = ComfyUIDownload(
        job_id=new_job(), files=[OUTPUT], report_silence_after_s=60.0, silent_since=AN_HOUR_AGO
    )
    failed, _ = await run_activity(comfyui_activities().download, download)
    silent = failure(failed)
    assert silent.type == HOST_SILENT
    assert Silence.model_validate(silent.details[0]).silent_since == AN_HOUR_AGO


async def test_an_answer_since_the_silence_began_starts_it_again(
    comfyui: ComfyUIDouble, comfyui_activities, comfyui_settings, tmp_path: Path
):
    acts, job_id = comfyui_activities(), new_job()
    cancelled, _ = await run_activity(acts.cancel, ComfyUICancel(prompt_id="none"))
    assert cancelled.was == "gone"  # ComfyUI answered its GET /queue
    (tmp_path / "start.png").write_bytes(png(64, 48))
    [item] = await prepare_inputs(
        comfyui_settings(), job_id, I2V_GRAPH, [str(tmp_path / "start.png")], cloud=False
    )
    comfyui.faults["/upload/image"] = "drop"
    upload = ComfyUIUpload(
        job_id=job_id, input=item, report_silence_after_s=60.0, silent_since=AN_HOUR_AGO
    )
    failed, beats = await run_activity(acts.upload, upload)
    assert failure(failed).type == UNAVAILABLE  # retried: silent for a moment, not an hour
    last = beats[-1]
    assert isinstance(last, Retried) and last.silent_since is not None
    assert last.silent_since > AN_HOUR_AGO + timedelta(minutes=59)


async def test_a_call_of_a_job_started_before_the_rule_retries_however_long_the_silence(
    comfyui: ComfyUIDouble, comfyui_activities
):
    comfyui.faults["/view"] = "drop"
    download = ComfyUIDownload(job_id=new_job(), files=[OUTPUT], silent_since=AN_HOUR_AGO)
    failed, _ = await run_activity(comfyui_activities().download, download)
    assert failure(failed).type == UNAVAILABLE and not failure(failed).non_retryable
