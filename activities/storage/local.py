"""The local output store: `SPILLWAY_OUTPUT_DIR/<job id>/<name>` on the host that downloaded it.
A body is streamed (a 2 GB video never sits in memory), hashed on the way, flushed to disk, and
renamed into place only when complete, so a file under its final name is always whole and a
re-run of the activity keeps it."""

from __future__ import annotations

import asyncio
import glob
import hashlib
import os
import time
import uuid
from collections.abc import AsyncIterable
from pathlib import Path
from urllib.parse import unquote, urlsplit

from activities.storage.store import (
    CHUNK_BYTES,
    PROGRESS_EVERY_S,
    IncompleteDownload,
    OutputStore,
    Progress,
    StoredOutput,
    StoreError,
    UnsafeName,
    Upload,
    folders,
)


class LocalOutputStore(OutputStore):
    def __init__(self, root: Path) -> None:
        self._root = root

    def _target(self, job_id: str, name: str) -> Path:
        job_id, *parts = folders(job_id, name)
        job_dir = (self._root / job_id).resolve()
        target = job_dir.joinpath(*parts)
        if not target.resolve().is_relative_to(job_dir):
            raise UnsafeName(f"output name {name!r} leads outside the job's folder (a symlink)")
        return target

    async def _put(self, upload: Upload, chunks: AsyncIterable[bytes]) -> StoredOutput:
        target = self._target(upload.job_id, upload.name)
        return await save(chunks, target, upload.progress, upload.size_hint)

    async def find(self, job_id: str, name: str) -> StoredOutput | None:
        target = self._target(job_id, name)
        if not target.is_file():  # renamed into place only once whole (save)
            return None
        return await asyncio.to_thread(describe, target)

    async def read(self, uri: str, limit: int) -> bytes:
        path = self._path_of(uri)
        try:
            size = path.stat().st_size
            if size > limit:
                raise StoreError(f"{path.name} is {size} bytes, over {limit}", retryable=False)
            return await asyncio.to_thread(path.read_bytes)
        except OSError as exc:
            raise StoreError(f"cannot read {path}: {exc.strerror}", retryable=True) from None

    def _path_of(self, uri: str) -> Path:
        # Only files under the store's own folder: a job's input names a file the worker reads
        # and sends on, so an arbitrary client must not make it read /etc/shadow.
        parts = urlsplit(uri)
        if parts.scheme != "file" or parts.netloc not in ("", "localhost"):
            raise StoreError(f"{uri!r} is not a file:// URI", retryable=False)
        path = Path(unquote(parts.path)).resolve()
        if not path.is_relative_to(self._root.resolve()):
            raise StoreError(
                f"{path} is outside SPILLWAY_OUTPUT_DIR ({self._root})", retryable=False
            )
        return path

    async def presign(self, uri: str, expires_s: int = 3600) -> str | None:
        return None


def describe(path: Path) -> StoredOutput:
    """Size and sha256 of a finished file (blocking: run it in a thread)."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return _stored(path, size, digest.hexdigest())


async def save(
    chunks: AsyncIterable[bytes],
    target: Path,
    progress: Progress | None = None,
    expected_bytes: int | None = None,
) -> StoredOutput:
    """Streams `chunks` to `target`; `progress(done, total)` about twice a second. Raises
    IncompleteDownload when the body ends elsewhere than `expected_bytes`."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".{glob.escape(target.name)}.*.part"):
        stale.unlink(missing_ok=True)  # left by a worker that died mid-download
    part = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.part")
    digest, size, last = hashlib.sha256(), 0, 0.0
    try:
        with part.open("wb") as out:
            async for chunk in chunks:
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                if progress is not None and time.monotonic() - last >= PROGRESS_EVERY_S:
                    last = time.monotonic()
                    progress(size, expected_bytes)
            out.flush()
            await asyncio.to_thread(os.fsync, out.fileno())
        if expected_bytes is not None and size != expected_bytes:
            raise IncompleteDownload(size, expected_bytes)
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    if progress is not None:
        progress(size, size)
    return _stored(target, size, digest.hexdigest())


def _stored(target: Path, size: int, sha256: str) -> StoredOutput:
    return StoredOutput(uri=target.as_uri(), path=str(target), bytes=size, sha256=sha256)
