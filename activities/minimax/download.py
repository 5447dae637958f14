"""The `minimax_download` activity's work (activities.py): a finished video's file
retrieved, its pre-signed URL streamed into the output store (docs/design.md, "MiniMax facts").

Free, and safe to run again: a video already in the store (whole, with its sha256) is kept and
nothing is fetched. A URL that has expired (401/403/404/410) is retrieved afresh, up to the
timing's `url_refreshes`. The key goes to MINIMAX_BASE_URL only, never to the file host.
"""

from __future__ import annotations

import re
from pathlib import PurePosixPath

from temporalio import activity
from temporalio.exceptions import ApplicationError

from activities.cloud.models import CloudDownload
from activities.cloud.provider import download_failures, progress_beats
from activities.heartbeat import Heartbeat
from activities.minimax.answers import PERMANENT_CODES, FileInfo, RetrieveAnswer, permanent_message
from activities.minimax.client import MiniMaxClient, MiniMaxUnavailable
from activities.minimax.errors import DOWNLOAD_FAILED, PERMANENT, UNAVAILABLE
from activities.storage.store import (
    CHUNK_BYTES,
    OutputStore,
    StoredOutput,
    StoreError,
    announced_bytes,
)
from spillway.core.models import Downloaded, Progress

# What an expired pre-signed download URL answers (object stores use 403; some CDNs 404/410).
EXPIRED_URL_STATUSES = frozenset({401, 403, 404, 410})
VIDEO_EXTENSIONS = frozenset({".mp4", ".mov", ".webm", ".mkv"})


class MiniMaxDownloader:
    def __init__(self, client: MiniMaxClient, store: OutputStore) -> None:
        self._client, self._store = client, store

    async def run(self, req: CloudDownload, key: str) -> Downloaded:
        if req.file_id is None:
            raise ApplicationError(
                f"MiniMax download of task {req.task_id} names no file", non_retryable=True
            )
        stem = f"minimax-{re.sub(r'[^A-Za-z0-9_-]', '_', req.task_id)[:64]}"
        try:
            for ext in sorted(VIDEO_EXTENSIONS):  # whichever MiniMax's filename gave it
                if kept := await self._store.find(req.job_id, stem + ext):
                    return Downloaded(outputs=[kept.output_file()])
            return await self._retrieve_and_fetch(req, req.file_id, key, stem)
        except StoreError as exc:
            raise exc.failure() from None

    async def _retrieve_and_fetch(
        self, req: CloudDownload, file_id: str, key: str, stem: str
    ) -> Downloaded:
        t = self._client.timing
        async with Heartbeat(t.heartbeat_every_s, Progress(phase="retrieving")) as hb:
            for _ in range(t.url_refreshes + 1):
                file = await self._retrieve(req, file_id, key)
                output = await self._fetch(req.job_id, file, stem + _extension(file.filename), hb)
                if output is not None:
                    activity.logger.info(
                        "MiniMax video of job %s saved: %s (%d bytes)",
                        req.job_id,
                        output.uri,
                        output.bytes,
                    )
                    return Downloaded(outputs=[output.output_file()])
                activity.logger.info(
                    "MiniMax download URL for file %s has expired: retrieving a new one", file_id
                )
        raise ApplicationError(
            f"MiniMax's download URLs for file {file_id} kept expiring "
            f"({t.url_refreshes + 1} tries); retrying later",
            type=DOWNLOAD_FAILED,
        )

    async def _retrieve(self, req: CloudDownload, file_id: str, key: str) -> FileInfo:
        params = {"file_id": file_id}
        try:
            answer = await self._client.get(
                "retrieve", "/v1/files/retrieve", params, key, RetrieveAnswer
            )
        except MiniMaxUnavailable as exc:
            raise ApplicationError(str(exc), type=UNAVAILABLE) from None
        code, msg = answer.base_resp.status_code, self._client.clean(answer.base_resp.status_msg)
        if code in PERMANENT_CODES:
            raise ApplicationError(
                permanent_message(code, msg, task_id=req.task_id),
                {"task_id": req.task_id, "file_id": file_id, "code": code},
                type=PERMANENT,
                non_retryable=True,
            )
        if code != 0 or answer.file is None:
            raise ApplicationError(
                f"MiniMax answered code {code} ({msg}) retrieving file {file_id} "
                f"of task {req.task_id}",
                type=UNAVAILABLE,
            )
        return answer.file

    async def _fetch(
        self, job_id: str, file: FileInfo, name: str, hb: Heartbeat
    ) -> StoredOutput | None:
        """The video into the store as `name`; None when the URL has expired. The key is not
        sent: the URL is pre-signed and often on another host."""
        with download_failures(
            DOWNLOAD_FAILED,
            f"download of file {file.file_id}",
            f"downloading MiniMax file {file.file_id}",
            self._client.clean,
        ):
            async with self._client.stream(file.download_url) as response:
                if response.status_code in EXPIRED_URL_STATUSES:
                    return None
                if not response.is_success:
                    raise ApplicationError(
                        f"the MiniMax file host answered HTTP {response.status_code}",
                        type=DOWNLOAD_FAILED,
                    )
                # MiniMax may announce 0 bytes; then the host's Content-Length is the check.
                size = file.bytes or announced_bytes(response)
                chunks = response.aiter_bytes(CHUNK_BYTES)
                output = await self._store.put(job_id, name, chunks, size, progress_beats(hb))
        hb.beat()
        return output


def _extension(filename: str) -> str:
    # Only a known video extension survives from MiniMax's filename: the name itself is ours,
    # so no '../', absolute path or odd suffix in it can reach the disk.
    ext = PurePosixPath(filename.replace("\\", "/")).suffix.lower()
    return ext if ext in VIDEO_EXTENSIONS else ".mp4"
