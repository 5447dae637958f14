"""Outputs on disk, for both routes: a download is streamed (a 2 GB video never sits in memory),
hashed on the way, flushed to disk, and renamed into place only when complete, so a file under
its final name is always whole and a re-run of the activity can keep it."""

from __future__ import annotations

import asyncio
import glob
import hashlib
import os
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import httpx

from spillway.models import OutputFile

CHUNK_BYTES = 1 << 20
PROGRESS_EVERY_S = 0.5


class IncompleteDownload(Exception):
    def __init__(self, size: int, expected: int) -> None:
        super().__init__(f"the download ended at {size} of {expected} bytes")


def describe(path: Path) -> OutputFile:
    """Size and sha256 of a finished file (blocking: run it in a thread)."""
    digest, size = hashlib.sha256(), 0
    with path.open("rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            size += len(chunk)
    return OutputFile(path=str(path), bytes=size, sha256=digest.hexdigest())


async def save(
    response: httpx.Response,
    target: Path,
    progress: Callable[[int, int | None], None],
    expected_bytes: int | None = None,
) -> OutputFile:
    """Streams a response body to `target`; `progress(done, total)` about twice a second.
    Raises IncompleteDownload when fewer bytes came than announced."""
    target.parent.mkdir(parents=True, exist_ok=True)
    for stale in target.parent.glob(f".{glob.escape(target.name)}.*.part"):
        stale.unlink(missing_ok=True)  # left by a worker that died mid-download
    part = target.with_name(f".{target.name}.{uuid.uuid4().hex[:12]}.part")
    total = expected_bytes or int(response.headers.get("content-length") or 0) or None
    digest, size, last = hashlib.sha256(), 0, 0.0
    try:
        with part.open("wb") as out:
            async for chunk in response.aiter_bytes(CHUNK_BYTES):
                out.write(chunk)
                digest.update(chunk)
                size += len(chunk)
                if time.monotonic() - last >= PROGRESS_EVERY_S:
                    last = time.monotonic()
                    progress(size, total)
            out.flush()
            await asyncio.to_thread(os.fsync, out.fileno())
        if total is not None and size != total:
            raise IncompleteDownload(size, total)
        os.replace(part, target)
    finally:
        part.unlink(missing_ok=True)
    progress(size, size)
    return OutputFile(path=str(target), bytes=size, sha256=digest.hexdigest())
