"""Which output store the settings choose (docs/design.md, "Clients, inputs and outputs"), and
opening it: `open_output_store(settings)` for a block (the worker, the CLI), `LazyOutputStore`
opened at first use (an activity class given no store: `OwnsOutputStore`), and presigned URLs
for `spillway status` and the job's callback. The stores themselves are local.py and s3.py."""

from __future__ import annotations

import asyncio
import contextlib
import re
from collections.abc import AsyncIterable, AsyncIterator

from activities.storage.local import LocalOutputStore
from activities.storage.store import OutputStore, StoredOutput, StoreError, Upload
from spillway.core.errors import ConfigError
from spillway.core.models import OutputFile, Plan
from spillway.core.settings import Settings

PRESIGN_EXPIRES_S = 3600  # how long a presigned output URL from `status` lasts

_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


def s3_location(settings: Settings) -> tuple[str, str] | None:
    """(bucket, prefix) of SPILLWAY_OUTPUT_URL, None when outputs stay in the local folder.
    Raises ConfigError (one line, never a credential) for what S3 would refuse or misplace."""
    url = settings.SPILLWAY_OUTPUT_URL
    endpoint = settings.AWS_ENDPOINT_URL
    if endpoint is not None and endpoint.username:
        raise ConfigError(
            "invalid output store setting: AWS_ENDPOINT_URL: credentials belong in "
            "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
        )
    if url is None:
        return None
    bucket, _, prefix = url.strip().removeprefix("s3://").partition("/")
    problem = None
    if "@" in bucket:
        problem = "credentials belong in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY"
    elif "?" in url or "#" in url:
        problem = "must be s3://BUCKET/PREFIX, without '?' or '#'"
    elif not _BUCKET.match(bucket):
        problem = f"{bucket!r} is not a bucket name (3-63 of a-z 0-9 . -)"
    folders_ = [p for p in prefix.split("/") if p]
    if problem is None and any(p in (".", "..") for p in folders_):
        problem = "the prefix may not contain '.' or '..'"
    if problem is not None:
        raise ConfigError(f"invalid output store setting: SPILLWAY_OUTPUT_URL: {problem}")
    return bucket, "/".join(folders_)


@contextlib.asynccontextmanager
async def open_output_store(settings: Settings) -> AsyncIterator[OutputStore]:
    """The store the settings choose, open until the block ends. ConfigError for bad settings."""
    location = s3_location(settings)
    if location is None:
        yield LocalOutputStore(settings.SPILLWAY_OUTPUT_DIR)
        return
    # Imported here: aiobotocore costs a CLI that stores locally a noticeable start-up.
    from activities.storage.s3 import open_s3_store

    async with open_s3_store(settings, *location) as store:
        yield store


class LazyOutputStore(OutputStore):
    """The store the settings choose, opened at its first use (inside the worker's event loop)
    and closed by `aclose()`; an activity class's default when it was given none."""

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._store: OutputStore | None = None
        self._stack: contextlib.AsyncExitStack | None = None
        self._lock: asyncio.Lock | None = None

    async def _opened(self) -> OutputStore:
        if self._store is not None:
            return self._store
        self._lock = self._lock or asyncio.Lock()
        async with self._lock:
            if self._store is None:
                stack = contextlib.AsyncExitStack()
                try:
                    self._store = await stack.enter_async_context(open_output_store(self._settings))
                except ConfigError as exc:
                    await stack.aclose()
                    raise StoreError(str(exc), retryable=False) from None
                self._stack = stack
        return self._store

    async def _put(self, upload: Upload, chunks: AsyncIterable[bytes]) -> StoredOutput:
        return await (await self._opened())._put(upload, chunks)

    async def find(self, job_id: str, name: str) -> StoredOutput | None:
        return await (await self._opened()).find(job_id, name)

    async def read(self, uri: str, limit: int) -> bytes:
        return await (await self._opened()).read(uri, limit)

    async def presign(self, uri: str, expires_s: int = 3600) -> str | None:
        return await (await self._opened()).presign(uri, expires_s)

    async def aclose(self) -> None:
        stack, self._stack, self._store = self._stack, None, None
        if stack is not None:
            await stack.aclose()


async def presign(settings: Settings, uri: str | None, expires_s: int = 3600) -> str | None:
    """A URL that downloads an s3:// output (an OutputFile's `uri`) for `expires_s` seconds
    (1 s to 7 days), signed here without a request to S3; None for a local output (`uri` None,
    or any other URI). ConfigError for bad settings, ValueError for a bad `uri` or `expires_s`,
    StoreError if signing failed."""
    if uri is None or not uri.startswith("s3://"):
        return None
    async with open_output_store(settings) as store:
        return await store.presign(uri, expires_s)


class OwnsOutputStore:
    """What every activity class that writes outputs shares: the worker's one output store, or,
    when a test or a tool gives none, a store of its own, opened at first use and closed by
    `aclose()`."""

    _store: OutputStore
    _own_store: LazyOutputStore | None = None

    def _use_store(self, settings: Settings, store: OutputStore | None) -> OutputStore:
        if store is None:
            store = self._own_store = LazyOutputStore(settings)
        self._store = store
        return store

    async def aclose(self) -> None:
        """Closes the output store these activities opened themselves, if any."""
        if self._own_store is not None:
            await self._own_store.aclose()


async def presign_outputs(
    plan: Plan, settings: Settings, expires_s: int = PRESIGN_EXPIRES_S
) -> Plan:
    """The plan with a `url` for every output in object storage that these settings can sign
    (SPILLWAY_OUTPUT_URL and the AWS_* variables); the others keep `url` None. Signing makes
    no request to S3, and a store that cannot sign leaves the URLs out rather than failing
    `status`."""
    if not any(out.uri and out.uri.startswith("s3://") for out in plan.outputs):
        return plan
    outputs: list[OutputFile] = []
    for out in plan.outputs:
        url = None
        if out.uri:
            with contextlib.suppress(ConfigError, StoreError, ValueError):
                url = await presign(settings, out.uri, expires_s)
        outputs.append(out.model_copy(update={"url": url}))
    return plan.model_copy(update={"outputs": outputs})
