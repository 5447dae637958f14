"""The `kling_download` activity's work (activities.py): the finished video streamed
from Kling's CDN into the output store (docs/design.md, "Kling facts").

Free, and safe to run again: a video already in the store (whole, with its sha256) is kept and
nothing is fetched. The CDN URL needs no key, so none is sent and a worker without keys may
fetch it; Kling deletes videos after 30 days, and a URL answering 404/410 will not heal.
"""

from __future__ import annotations

import re

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cloud.models import CloudDownload
from activities.cloud.provider import download_failures, progress_beats
from activities.heartbeat import Heartbeat
from activities.kling.client import KlingClient, KlingError, KlingTiming
from activities.kling.errors import DOWNLOAD_FAILED, VIDEO_GONE, kling_failure
from activities.storage.store import (
    CHUNK_BYTES,
    OutputStore,
    StoredOutput,
    StoreError,
    announced_bytes,
)
from spillway.core.models import Downloaded, Progress


class KlingDownloader:
    def __init__(
        self, http: httpx.AsyncClient, base_url: str, timing: KlingTiming, store: OutputStore
    ) -> None:
        # No keys: the CDN URL is signed by Kling already.
        self._client = KlingClient(http, base_url, "", "", timing)
        self._timing, self._store = timing, store

    async def run(self, req: CloudDownload) -> Downloaded:
        if not req.video_url:
            raise ApplicationError(
                f"Kling download of task {req.task_id} names no video URL",
                type=DOWNLOAD_FAILED,
                non_retryable=True,
            )
        name = f"kling-{re.sub(r'[^A-Za-z0-9_-]', '_', req.task_id)[:64]}.mp4"
        try:
            if kept := await self._store.find(req.job_id, name):  # only whole ones are found
                return Downloaded(outputs=[kept.output_file()])
            output = await self._fetch(req, req.video_url, name)
        except StoreError as exc:
            raise exc.failure() from None
        activity.logger.info(
            "Kling video of job %s saved: %s (%d bytes)", req.job_id, output.uri, output.bytes
        )
        return Downloaded(outputs=[output.output_file()])

    async def _fetch(self, req: CloudDownload, video_url: str, name: str) -> StoredOutput:
        client = self._client
        failures = download_failures(
            DOWNLOAD_FAILED,
            f"download of Kling task {req.task_id}",
            f"downloading the video of Kling task {req.task_id}",
            client.clean,
        )
        async with Heartbeat(self._timing.heartbeat_every_s, Progress(phase="downloading")) as hb:
            try:
                with failures:
                    async with client.stream_video(video_url) as response:
                        chunks = response.aiter_bytes(CHUNK_BYTES)
                        size = announced_bytes(response)
                        return await self._store.put(
                            req.job_id, name, chunks, size, progress_beats(hb)
                        )
            except KlingError as exc:
                gone = _gone(req, exc)
                details = {"task_id": req.task_id, "http_status": exc.http_status}
                raise kling_failure(exc, DOWNLOAD_FAILED, VIDEO_GONE, gone, details) from None


def _gone(req: CloudDownload, exc: KlingError) -> str:
    return (
        f"the video of Kling task {req.task_id} (job {req.job_id}) is gone: {exc}. Kling deletes "
        "videos 30 days after it makes them and such a URL does not come back; the task was "
        "charged. Resubmit the job to render it again."
    )
