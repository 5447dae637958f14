"""Files in and out of ComfyUI, for the LOCAL route's activities:
outputs streamed from `/view` into the output store, input images put into ComfyUI's input
folder with `POST /upload/image` (docs/design.md, "ComfyUI facts" and "Clients, inputs and
outputs").

Both are safe to run again. An output already in the store (whole, with its sha256) is kept and
not fetched again. An input goes up under a content-hash name with overwrite, so a retried upload
writes the same file again: ComfyUI never ends up with `name (1).png` for one of ours.

Failures are the client's, the store's and the input reader's own exceptions; the activity turns
them into the ApplicationError types the workflow's retry policies name.
"""

from __future__ import annotations

import hashlib

import httpx
from temporalio import activity

from activities.comfyui.answers import output_name, uploaded_name
from activities.comfyui.client import ComfyUIClient, UploadRefused
from activities.comfyui.models import (
    UPLOAD_SUBFOLDER,
    ComfyUIDownload,
    ComfyUIFile,
    ComfyUIUpload,
    ComfyUIUploaded,
)
from activities.heartbeat import Heartbeat
from activities.inputs import read_input
from activities.storage.store import CHUNK_BYTES, OutputStore, StoredOutput, announced_bytes
from spillway.core.images import sniff
from spillway.core.models import Downloaded, Progress


class ComfyUIFiles:
    def __init__(
        self,
        client: ComfyUIClient,
        store: OutputStore,
        http: httpx.AsyncClient,
        allow: frozenset[str],
    ) -> None:
        self._client, self._store, self._http = client, store, http
        self._allow = allow  # SPILLWAY_INPUT_ALLOW_HOSTS

    # --- outputs -----------------------------------------------------------------------------

    async def download(self, req: ComfyUIDownload, heartbeat: Heartbeat) -> Downloaded:
        names = [output_name(f) for f in req.files]  # all checked before any request
        outputs = []
        for file, name in zip(req.files, names, strict=True):
            kept = await self._store.find(req.job_id, name)
            if kept is None:
                kept = await self._fetch(req.job_id, file, name, heartbeat)
            else:
                heartbeat.update(Progress(phase="downloaded", node=file.filename))
            outputs.append(kept.output_file())
        return Downloaded(outputs=outputs)

    async def _fetch(
        self, job_id: str, file: ComfyUIFile, name: str, heartbeat: Heartbeat
    ) -> StoredOutput:
        def progress(done: int, total: int | None) -> None:
            percent = round(100 * done / total, 1) if total else None
            shown = Progress(
                phase="downloading", node=file.filename, value=done, max=total, percent=percent
            )
            heartbeat.update(shown)

        async with self._client.view(file) as response:
            stored = await self._store.put(
                job_id,
                name,
                response.aiter_bytes(CHUNK_BYTES),
                announced_bytes(response),
                progress,
            )
        activity.logger.info("downloaded %s (%d bytes)", stored.uri, stored.bytes)
        return stored

    # --- inputs ------------------------------------------------------------------------------

    async def upload(self, req: ComfyUIUpload) -> ComfyUIUploaded:
        data = await read_input(self._store, self._http, req.input, allow=self._allow)
        sha256 = hashlib.sha256(data).hexdigest()
        info = sniff(data)
        # The content names the file: the same image is the same name, whichever job or
        # attempt sends it, and other bytes can never take an existing name.
        name = f"{sha256}.{info.ext if info is not None else 'png'}"
        mime = info.mime if info is not None else "application/octet-stream"
        answer = await self._client.upload_image(data, name, mime, UPLOAD_SUBFOLDER)
        image = uploaded_name(answer)
        if image is None:
            raise UploadRefused(f"ComfyUI answered the upload of {name} without a name")
        activity.logger.info(
            "uploaded the input of node %s for job %s as %s (%d bytes)",
            req.input.node,
            req.job_id,
            image,
            len(data),
        )
        return ComfyUIUploaded(node=req.input.node, name=image, sha256=sha256)
