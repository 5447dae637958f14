"""Outputs anywhere (docs/design.md, "Clients, inputs and outputs"): with SPILLWAY_OUTPUT_URL an
image-to-video job's input goes to the bucket at submit, reaches ComfyUI or MiniMax from there,
and the video lands in the bucket under `<prefix>/<job id>/` with its sha256; the presigned URL
`spillway status` shows downloads it; a re-run keeps what is there. All against moto on
127.0.0.1 and the ComfyUI and MiniMax doubles."""

from __future__ import annotations

import base64
import hashlib
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from activities.cloud.models import CloudCreate, CloudCreated, CloudDone, CloudDownload, CloudPoll
from activities.comfyui.models import ComfyUIDownload, ComfyUIFinished, ComfyUIUpload
from activities.storage.opening import open_output_store, presign
from spillway.client.inputs import prepare_inputs
from spillway.core.images import with_inputs
from spillway.core.models import CloudRequest, Downloaded
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.comfyui import submit_request, wait_request
from tests.support.images import I2V_GRAPH, jpeg, png
from tests.support.minimax import VIDEO_SIZE

if TYPE_CHECKING:
    from tests.support.s3 import S3Endpoint

pytest_plugins = ["tests.support.s3"]


def new_job() -> str:
    return f"job-{uuid.uuid4().hex[:12]}"


async def in_bucket(s3: S3Endpoint, key: str) -> tuple[str, dict[str, str]]:
    """The object's sha256 as computed from its bytes, and its metadata."""
    async with s3.client() as client:
        got = await client.get_object(Bucket=s3.bucket, Key=key)
        async with got["Body"] as body:
            data = await body.read()
    return hashlib.sha256(data).hexdigest(), got["Metadata"]


async def fetched_sha256(http: httpx.AsyncClient, url: str | None) -> str:
    assert url is not None
    response = await http.get(url)
    assert response.status_code == 200, response.text[:200]
    return hashlib.sha256(response.content).hexdigest()


async def test_a_comfyui_jobs_input_and_video_live_in_the_bucket_and_the_url_downloads_it(
    s3: S3Endpoint,
    comfyui: ComfyUISim,
    comfyui_activities,
    comfyui_settings,
    run_activity,
    http: httpx.AsyncClient,
    tmp_path: Path,
):
    comfyui.execution_s, comfyui.output_bytes = 0, 9 * 1024 * 1024 + 5  # two parts
    settings, job_id, frame = comfyui_settings(**s3.env()), new_job(), png(640, 480)
    (tmp_path / "start.png").write_bytes(frame)
    [item] = await prepare_inputs(
        settings, job_id, I2V_GRAPH, [str(tmp_path / "start.png")], cloud=False
    )
    assert item.uri.startswith(f"s3://{s3.bucket}/outputs/{job_id}/inputs/")

    async with open_output_store(settings) as store:  # the worker's one store, injected
        acts = comfyui_activities(store=store, **s3.env())
        uploaded, _ = await run_activity(acts.upload, ComfyUIUpload(job_id=job_id, input=item))
        assert comfyui.inputs.files[uploaded.name] == frame  # read from the bucket
        req = submit_request(job_id, with_inputs(I2V_GRAPH, {uploaded.node: uploaded.name}))
        await run_activity(acts.submit, req)
        finished, _ = await run_activity(acts.wait, wait_request(req))
        assert isinstance(finished, ComfyUIFinished), finished
        download = ComfyUIDownload(job_id=job_id, files=finished.files)
        downloaded, _ = await run_activity(acts.download, download)
        again, _ = await run_activity(acts.download, download)

    assert isinstance(downloaded, Downloaded), downloaded
    [output] = downloaded.outputs
    key = f"outputs/{job_id}/i2v/job_00001_.mp4"
    expected = comfyui.expected_sha256("job_00001_.mp4", "i2v")
    assert (output.uri, output.path) == (f"s3://{s3.bucket}/{key}", key)
    assert (output.bytes, output.sha256) == (comfyui.output_bytes, expected)
    assert await in_bucket(s3, key) == (expected, {"sha256": expected})
    assert again == downloaded and comfyui.hits["GET /view"] == 1  # kept, not fetched again
    assert not (tmp_path / "outputs").exists()  # nothing on the worker's disk
    url = await presign(settings, output.uri, 600)
    assert await fetched_sha256(http, url) == expected


async def test_a_minimax_video_lands_in_the_bucket_and_its_first_frame_came_from_there(
    s3: S3Endpoint,
    minimax: MiniMaxSim,
    minimax_activities,
    minimax_settings,
    run_activity,
    http: httpx.AsyncClient,
    tmp_path: Path,
):
    settings, job_id, frame = minimax_settings(**s3.env()), new_job(), jpeg(1280, 720)
    (tmp_path / "start.jpg").write_bytes(frame)
    graph: dict[str, Any] = I2V_GRAPH
    [item] = await prepare_inputs(
        settings, job_id, graph, [str(tmp_path / "start.jpg")], cloud=True
    )
    acts = minimax_activities(**s3.env())  # no store given: the activities open their own
    req = CloudCreate(
        job_id=job_id,
        request=CloudRequest(prompt="the first frame comes alive"),
        authorisation="approved",
        first_frame=item,
    )
    try:
        created, _ = await run_activity(acts.create, req)
        assert isinstance(created, CloudCreated), created
        done, _ = await run_activity(acts.poll, CloudPoll(job_id=job_id, task_id=created.task_id))
        assert isinstance(done, CloudDone), done
        download = CloudDownload(job_id=job_id, task_id=done.task_id, file_id=done.file_id)
        downloaded, _ = await run_activity(acts.download, download)
    finally:
        await acts.aclose()

    [body] = minimax.create_bodies
    assert body["first_frame_image"] == "data:image/jpeg;base64," + base64.b64encode(frame).decode(
        "ascii"
    )
    assert isinstance(downloaded, Downloaded), downloaded
    [output] = downloaded.outputs
    expected = minimax.sha256_of_task(created.task_id)
    key = f"outputs/{job_id}/minimax-{created.task_id}.mp4"
    assert (output.uri, output.bytes, output.sha256) == (
        f"s3://{s3.bucket}/{key}",
        VIDEO_SIZE,
        expected,
    )
    assert await in_bucket(s3, key) == (expected, {"sha256": expected})
    assert await fetched_sha256(http, await presign(settings, output.uri)) == expected
