"""The output store's contract (docs/design.md, "Clients, inputs and outputs"): where outputs and
input images are kept, a local folder (`SPILLWAY_OUTPUT_DIR/<job id>/`, the default, local.py)
or S3-compatible storage (`SPILLWAY_OUTPUT_URL=s3://bucket/prefix`: AWS, MinIO, R2, SeaweedFS;
s3.py).

Both stream, so a 2 GB video never sits in memory, and both keep one promise: an object under
its final name is whole, with its sha256 recorded, so a re-run finds it (`find`) and keeps it.

One store per worker process, chosen and opened by opening.py (one S3 client
for its whole life, like the worker's httpx client). Activity classes take it as `store=`;
without one they build a `LazyOutputStore`, opened at first use and closed by their `aclose()`.

Credentials never reach an error or a log line: every S3 failure is a StoreError that names the
operation and S3's error code, without the original exception attached.
"""

from __future__ import annotations

import abc
import re
from collections.abc import AsyncIterable, AsyncIterator, Callable
from dataclasses import dataclass

import httpx
from pydantic import BaseModel
from temporalio.exceptions import ApplicationError

from spillway.core.models import OutputFile

STORE_FAILED = "OutputStoreFailed"  # the activity failure a StoreError becomes (`failure`)
MAX_PRESIGN_S = 7 * 86400  # SigV4's limit
CHUNK_BYTES = 1 << 20
PROGRESS_EVERY_S = 0.5  # how often a stream reports its progress


class IncompleteDownload(Exception):
    def __init__(self, size: int, expected: int) -> None:
        super().__init__(f"the download ended at {size} of {expected} bytes")


Progress = Callable[[int, int | None], None]

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")


class StoredOutput(BaseModel):
    uri: str  # s3://bucket/prefix/<job id>/<name>, or file:///<absolute path> (local folder)
    path: str  # the object's key, or the local file's absolute path
    bytes: int
    sha256: str

    def output_file(self) -> OutputFile:
        """As a job's plan shows it. A local file keeps `uri` None: its path already says where
        it is, on the host that downloaded it, and nothing can presign it."""
        uri = self.uri if self.uri.startswith("s3://") else None
        return OutputFile(path=self.path, bytes=self.bytes, sha256=self.sha256, uri=uri)


class UnsafeName(ValueError):
    """A job id or output name that would land outside the job's folder or prefix."""


class StoreError(Exception):
    """The store refused or could not be reached. The message names the operation and S3's
    error code and never a credential; `retryable` is False when only a change of settings (or
    of the request) can help."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable

    def failure(self) -> ApplicationError:
        """As the failure of an activity that stores: always retried, even when only new
        settings help, since the output exists (and a cloud one is paid for) and a worker
        restarted with them finishes the job."""
        return ApplicationError(f"output store: {self}", type=STORE_FAILED)


@dataclass(frozen=True)
class Upload:
    """One `put`: where its body goes and what is known of it."""

    job_id: str
    name: str
    size_hint: int | None
    progress: Progress | None


class OutputStore(abc.ABC):
    async def put(
        self,
        job_id: str,
        name: str,
        chunks: AsyncIterable[bytes],
        size_hint: int | None = None,
        progress: Progress | None = None,
    ) -> StoredOutput:
        """Streams `chunks` to `<job id>/<name>` (`name` may hold '/' for subfolders).
        `size_hint`, when given, must be the body's size: a body that ends elsewhere raises
        IncompleteDownload and stores nothing. `progress(done, total)` about twice a
        second, for heartbeats."""
        return await self._put(Upload(job_id, name, size_hint, progress), chunks)

    @abc.abstractmethod
    async def _put(self, upload: Upload, chunks: AsyncIterable[bytes]) -> StoredOutput:
        """`put`'s work, as each store does it (callers see `put`'s one signature)."""

    @abc.abstractmethod
    async def find(self, job_id: str, name: str) -> StoredOutput | None:
        """The finished object at `<job id>/<name>`, or None: a re-run keeps what it finds."""

    @abc.abstractmethod
    async def read(self, uri: str, limit: int) -> bytes:
        """A small object of this store (an input image), whole; StoreError (not retryable)
        when it is larger than `limit` or `uri` is not this store's."""

    @abc.abstractmethod
    async def presign(self, uri: str, expires_s: int = 3600) -> str | None:
        """A URL anyone can GET for `expires_s` seconds; None for a local file."""


def folders(job_id: str, name: str) -> list[str]:
    """`[job id, *name's parts]`, refusing what would leave the job's folder or prefix."""
    if not _JOB_ID.match(job_id):
        raise UnsafeName(f"job id {job_id!r} cannot name a folder")
    parts = name.split("/")
    if any(not p or p.startswith(".") or "\\" in p or "\x00" in p for p in parts):
        raise UnsafeName(f"output name {name!r} would land outside the job's folder")
    return [job_id, *parts]


async def chunks_of(data: bytes, size: int = CHUNK_BYTES) -> AsyncIterator[bytes]:
    for start in range(0, len(data), size):
        yield data[start : start + size]


def announced_bytes(response: httpx.Response) -> int | None:
    """The body's size as the server announced it, when that is what `aiter_bytes` yields (a
    compressed body's Content-Length counts the compressed bytes)."""
    if response.headers.get("content-encoding", "identity") != "identity":
        return None
    length = response.headers.get("content-length", "")
    return int(length) if length.isdigit() else None
