"""Where outputs are kept: a local folder (`SPILLWAY_OUTPUT_DIR/<job id>/`, the default) or
S3-compatible storage (`SPILLWAY_OUTPUT_URL=s3://bucket/prefix`: AWS, MinIO, R2, SeaweedFS).

Both stream, so a 2 GB video never sits in memory. The local store is activities/files.py's
download path (hashed, fsynced, renamed when whole). The S3 store sends one part at a time and
keeps the same promise that an object under its final key is whole: S3 fixes an object's metadata
when its upload starts, but the sha256 is known only at the end, so a multipart upload goes to a
hidden staging key first and a server-side copy puts it in place with the sha256 (then the
staging object is deleted). Bodies smaller than one part go up in a single PUT. A re-run of a put
writes the same key again: harmless. Uploads and staging objects left by a worker that died are
cleared by the next put of the same output.

Credentials never reach an error or a log line: every S3 failure becomes a StoreError that names
the operation and S3's error code, without the original exception attached. The bucket policy
needs s3:PutObject, s3:GetObject (the copy reads the staging object; presigned URLs read outputs),
s3:DeleteObject and s3:AbortMultipartUpload; s3:ListBucket and s3:ListBucketMultipartUploads let
a re-run clear what a killed worker left (without them that is skipped, with a warning).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mimetypes
import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import aiohttp
import httpx
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError
from pydantic import AliasChoices, BaseModel, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from activities import files
from spillway.errors import ConfigError

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_s3.type_defs import CompletedPartTypeDef

log = logging.getLogger("spillway.storage")

MIB = 1 << 20
# One part in memory at a time (plus the chunk being added): ~2 parts of RSS per upload.
PART_BYTES = 8 * MIB
MAX_PARTS = 10_000  # S3's limit: 8 MiB parts reach 78 GiB; a size hint raises the part size
SINGLE_COPY_LIMIT = 5 << 30  # CopyObject's limit; larger objects are copied range by range
COPY_PART_BYTES = 512 * MIB
S3_ATTEMPTS = 5  # botocore's own retries of one request (a 503 on one part redoes only that part)
MAX_PRESIGN_S = 7 * 86400  # SigV4's limit
PROGRESS_EVERY_S = files.PROGRESS_EVERY_S
# Errors that a retry cannot fix: the bucket or the credentials are wrong.
PERMANENT_CODES = frozenset(
    {
        "AccessDenied",
        "AllAccessDisabled",
        "InvalidAccessKeyId",
        "InvalidBucketName",
        "NoSuchBucket",
        "SignatureDoesNotMatch",
    }
)

Progress = Callable[[int, int | None], None]

_JOB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")


# --- settings ------------------------------------------------------------------------------


class OutputSettings(BaseSettings):
    """The output store's part of the environment (to be merged into spillway.settings)."""

    model_config = SettingsConfigDict(
        case_sensitive=True, extra="ignore", frozen=True, hide_input_in_errors=True
    )

    SPILLWAY_OUTPUT_URL: str | None = None  # s3://bucket[/prefix]; unset: the local folder
    SPILLWAY_OUTPUT_DIR: Path = Path("outputs")
    # The standard AWS variables; unset keys leave botocore's own chain (profile, instance role).
    AWS_ACCESS_KEY_ID: SecretStr | None = None
    AWS_SECRET_ACCESS_KEY: SecretStr | None = None
    AWS_SESSION_TOKEN: SecretStr | None = None
    AWS_REGION: str | None = Field(
        None, validation_alias=AliasChoices("AWS_REGION", "AWS_DEFAULT_REGION")
    )
    AWS_ENDPOINT_URL: str | None = None  # MinIO / R2 / SeaweedFS; path-style addressing then

    @field_validator(
        "SPILLWAY_OUTPUT_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "AWS_REGION",
        "AWS_ENDPOINT_URL",
        mode="before",
    )
    @classmethod
    def _empty_means_unset(cls, value: object) -> object:
        if isinstance(value, str) and not value.strip():
            return None
        return value

    @field_validator("SPILLWAY_OUTPUT_URL")
    @classmethod
    def _s3_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        scheme, _, rest = value.strip().partition("://")
        if scheme != "s3" or not rest:
            raise ValueError("must be s3://BUCKET or s3://BUCKET/PREFIX")
        bucket, _, prefix = rest.partition("/")
        if "@" in bucket:
            raise ValueError("credentials belong in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")
        if "?" in rest or "#" in rest:
            raise ValueError("must be s3://BUCKET/PREFIX, without '?' or '#'")
        if not _BUCKET.match(bucket):
            raise ValueError(f"{bucket!r} is not a bucket name (3-63 of a-z 0-9 . -)")
        folders = [p for p in prefix.split("/") if p]
        if any(p in (".", "..") for p in folders):
            raise ValueError("the prefix may not contain '.' or '..'")
        return "/".join([f"s3://{bucket}", *folders])

    @field_validator("AWS_ENDPOINT_URL")
    @classmethod
    def _endpoint(cls, value: str | None) -> str | None:
        if value is None:
            return None
        parsed = httpx.URL(value.strip())
        if parsed.scheme not in ("http", "https") or not parsed.host:
            raise ValueError("must be an http(s) URL such as http://127.0.0.1:9000")
        if parsed.userinfo:
            raise ValueError("credentials belong in AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY")
        return value.strip()

    @property
    def bucket(self) -> str:
        assert self.SPILLWAY_OUTPUT_URL is not None
        return self.SPILLWAY_OUTPUT_URL.removeprefix("s3://").partition("/")[0]

    @property
    def prefix(self) -> str:
        assert self.SPILLWAY_OUTPUT_URL is not None
        return self.SPILLWAY_OUTPUT_URL.removeprefix("s3://").partition("/")[2]


def load_output_settings() -> OutputSettings:
    try:
        return OutputSettings()
    except ValidationError as exc:
        # hide_input_in_errors: a key's value is never echoed, not even clipped.
        problems = [f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors()]
        raise ConfigError("invalid output store setting: " + "; ".join(problems)) from None


# --- the stores ----------------------------------------------------------------------------


class StoredOutput(BaseModel):
    uri: str  # s3://bucket/prefix/<job id>/<name>, or the absolute local path
    bytes: int
    sha256: str


class UnsafeName(ValueError):
    """A job id or output name that would land outside the job's folder or prefix."""


class StoreError(Exception):
    """S3 refused or could not be reached. The message names the operation and S3's error code
    and never a credential; `retryable` is False when only a change of settings can help."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class OutputStore(Protocol):
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
        files.IncompleteDownload and stores nothing. `progress(done, total)` about twice a
        second, for heartbeats."""
        ...

    async def presign(self, uri: str, expires_s: int = 3600) -> str | None:
        """A URL anyone can GET for `expires_s` seconds; None for a local file."""
        ...


def _folders(job_id: str, name: str) -> list[str]:
    if not _JOB_ID.match(job_id):
        raise UnsafeName(f"job id {job_id!r} cannot name a folder")
    parts = name.split("/")
    if any(not p or p.startswith(".") or "\\" in p or "\x00" in p for p in parts):
        raise UnsafeName(f"output name {name!r} would land outside the job's folder")
    return [job_id, *parts]


def _ignore(done: int, total: int | None) -> None:
    pass


class LocalOutputStore:
    """Today's behaviour: `<root>/<job id>/<name>` on the host that downloaded it."""

    def __init__(self, root: Path) -> None:
        self._root = root

    async def put(
        self,
        job_id: str,
        name: str,
        chunks: AsyncIterable[bytes],
        size_hint: int | None = None,
        progress: Progress | None = None,
    ) -> StoredOutput:
        job_id, *parts = _folders(job_id, name)
        job_dir = (self._root / job_id).resolve()
        target = job_dir.joinpath(*parts)
        if not target.resolve().is_relative_to(job_dir):
            raise UnsafeName(f"output name {name!r} leads outside the job's folder (a symlink)")
        # files.save streams an httpx response: an in-memory one carrying the chunks is that.
        body = httpx.Response(200, content=chunks)
        saved = await files.save(body, target, progress or _ignore, size_hint)
        return StoredOutput(uri=saved.path, bytes=saved.bytes, sha256=saved.sha256)

    async def presign(self, uri: str, expires_s: int = 3600) -> str | None:
        return None


class _Meter:
    def __init__(self, progress: Progress | None, total: int | None) -> None:
        self._progress, self._total = progress or _ignore, total
        self.done, self._last = 0, 0.0

    def add(self, n: int) -> None:
        self.done += n
        if time.monotonic() - self._last >= PROGRESS_EVERY_S:
            self._last = time.monotonic()
            self._progress(self.done, self._total)

    def check(self) -> None:
        if self._total is not None and self.done != self._total:
            raise files.IncompleteDownload(self.done, self._total)

    def finish(self) -> None:
        self._progress(self.done, self.done)


async def _parts(
    chunks: AsyncIterable[bytes], size: int, digest: hashlib._Hash, meter: _Meter
) -> AsyncGenerator[bytes, None]:
    """The body cut into parts of exactly `size` bytes (R2 wants every part but the last the
    same size), the last shorter; at least one part, empty for an empty body."""
    buf, sent = bytearray(), False
    async for chunk in chunks:
        digest.update(chunk)
        meter.add(len(chunk))
        buf += chunk
        while len(buf) >= size:
            with memoryview(buf) as view:
                part = bytes(view[:size])
            del buf[:size]
            sent = True
            yield part
            del part
    if buf or not sent:
        yield bytes(buf)


def _part_size(size_hint: int | None) -> int:
    if not size_hint:
        return PART_BYTES
    needed = -(-size_hint // MAX_PARTS)
    return max(PART_BYTES, -(-needed // MIB) * MIB)


class S3OutputStore:
    """`s3://<bucket>/<prefix>/<job id>/<name>`, with its sha256 as the `sha256` metadata."""

    def __init__(
        self, client: S3Client, bucket: str, prefix: str, secrets: tuple[str, ...] = ()
    ) -> None:
        self._s3, self._bucket, self._prefix = client, bucket, prefix.strip("/")
        self._secrets = tuple(s for s in secrets if s)

    def _key(self, job_id: str, name: str) -> str:
        return "/".join(([self._prefix] if self._prefix else []) + _folders(job_id, name))

    async def put(
        self,
        job_id: str,
        name: str,
        chunks: AsyncIterable[bytes],
        size_hint: int | None = None,
        progress: Progress | None = None,
    ) -> StoredOutput:
        key = self._key(job_id, name)
        content_type = mimetypes.guess_type(name)[0] or "application/octet-stream"
        await self._clear_stale(key)
        part_bytes, digest = _part_size(size_hint), hashlib.sha256()
        meter = _Meter(progress, size_hint)
        async with contextlib.aclosing(_parts(chunks, part_bytes, digest, meter)) as parts:
            first = await anext(parts)
            if len(first) < part_bytes:  # the whole body is in hand: one PUT, sha256 known
                meter.check()
                with self._errors("PutObject"):
                    await self._s3.put_object(
                        Bucket=self._bucket,
                        Key=key,
                        Body=first,
                        ContentType=content_type,
                        Metadata={"sha256": digest.hexdigest()},
                    )
            else:
                staging = _staging_key(key)
                # Handed over in a list so that this frame does not keep the first part alive.
                held, first = [first], b""
                await self._upload(staging, held, parts, meter, content_type)
                try:
                    await self._place(staging, key, meter.done, digest.hexdigest(), content_type)
                finally:
                    await self._delete_quietly(staging)
        meter.finish()
        log.info("stored %s (%d bytes)", f"s3://{self._bucket}/{key}", meter.done)
        return StoredOutput(
            uri=f"s3://{self._bucket}/{key}", bytes=meter.done, sha256=digest.hexdigest()
        )

    async def _upload(
        self,
        key: str,
        held: list[bytes],
        parts: AsyncIterator[bytes],
        meter: _Meter,
        content_type: str,
    ) -> None:
        """A multipart upload of the part in `held` and the rest of `parts`, one in memory at a
        time; aborted on any failure, cancellation included, so no upload is left to bill."""
        with self._errors("CreateMultipartUpload"):
            created = await self._s3.create_multipart_upload(
                Bucket=self._bucket, Key=key, ContentType=content_type
            )
        upload_id = created["UploadId"]
        done: list[CompletedPartTypeDef] = []
        try:
            part: bytes | None = held.pop()
            while part is not None:
                number = len(done) + 1
                if number > MAX_PARTS:
                    raise StoreError(
                        f"the body needs more than {MAX_PARTS} parts: pass its size as size_hint",
                        retryable=False,
                    )
                with self._errors("UploadPart"):
                    sent = await self._s3.upload_part(
                        Bucket=self._bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        Body=part,
                    )
                done.append({"ETag": sent["ETag"], "PartNumber": number})
                part = None  # let it go before the next one is read
                part = await anext(parts, None)
            meter.check()
            with self._errors("CompleteMultipartUpload"):
                await self._s3.complete_multipart_upload(
                    Bucket=self._bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": done},
                )
        except BaseException:
            await self._abort_quietly(key, upload_id)
            raise

    async def _place(
        self, staging: str, key: str, size: int, sha256: str, content_type: str
    ) -> None:
        """Server-side copy of the staging object to `key` with its sha256 (no bytes travel)."""
        metadata = {"sha256": sha256}
        if size <= SINGLE_COPY_LIMIT:
            with self._errors("CopyObject"):
                await self._s3.copy_object(
                    Bucket=self._bucket,
                    Key=key,
                    CopySource={"Bucket": self._bucket, "Key": staging},
                    Metadata=metadata,
                    MetadataDirective="REPLACE",
                    ContentType=content_type,
                )
            return
        with self._errors("CreateMultipartUpload"):
            created = await self._s3.create_multipart_upload(
                Bucket=self._bucket, Key=key, ContentType=content_type, Metadata=metadata
            )
        upload_id = created["UploadId"]
        done: list[CompletedPartTypeDef] = []
        try:
            for number, start in enumerate(range(0, size, COPY_PART_BYTES), 1):
                end = min(start + COPY_PART_BYTES, size) - 1
                with self._errors("UploadPartCopy"):
                    copied = await self._s3.upload_part_copy(
                        Bucket=self._bucket,
                        Key=key,
                        UploadId=upload_id,
                        PartNumber=number,
                        CopySource={"Bucket": self._bucket, "Key": staging},
                        CopySourceRange=f"bytes={start}-{end}",
                    )
                done.append({"ETag": copied["CopyPartResult"]["ETag"], "PartNumber": number})
            with self._errors("CompleteMultipartUpload"):
                await self._s3.complete_multipart_upload(
                    Bucket=self._bucket,
                    Key=key,
                    UploadId=upload_id,
                    MultipartUpload={"Parts": done},
                )
        except BaseException:
            await self._abort_quietly(key, upload_id)
            raise

    async def _clear_stale(self, key: str) -> None:
        """Aborts the uploads and deletes the staging objects of an earlier attempt at `key`
        (a worker killed mid-upload leaves them; S3 bills an unfinished upload's parts). Best
        effort: credentials allowed to write but not to list skip it (a bucket lifecycle rule
        that aborts incomplete uploads after a day is the net either way)."""
        folder, _, base = key.rpartition("/")
        prefix = f"{folder}/.{base}."
        stale = re.compile(rf"^{re.escape(prefix)}[0-9a-f]{{12}}\.part$")
        try:
            with self._errors("ListMultipartUploads"):
                listed = await self._s3.list_multipart_uploads(Bucket=self._bucket, Prefix=prefix)
            with self._errors("ListObjectsV2"):
                objects = await self._s3.list_objects_v2(Bucket=self._bucket, Prefix=prefix)
        except StoreError as exc:
            log.warning("left-overs of earlier uploads to %s not cleared: %s", key, exc)
            return
        for upload in listed.get("Uploads", []):
            if stale.match(upload.get("Key", "")) and "UploadId" in upload:
                await self._abort_quietly(upload["Key"], upload["UploadId"])
        for obj in objects.get("Contents", []):
            if stale.match(obj.get("Key", "")):
                await self._delete_quietly(obj["Key"])

    async def _abort_quietly(self, key: str, upload_id: str) -> None:
        try:
            await self._s3.abort_multipart_upload(Bucket=self._bucket, Key=key, UploadId=upload_id)
        except (BotoCoreError, ClientError, aiohttp.ClientError) as exc:
            # The next put of this output aborts it again; a bucket lifecycle rule is the net.
            log.warning("could not abort an upload to %s: %s", key, self._why(exc))

    async def _delete_quietly(self, key: str) -> None:
        try:
            await self._s3.delete_object(Bucket=self._bucket, Key=key)
        except (BotoCoreError, ClientError, aiohttp.ClientError) as exc:
            log.warning("could not delete the staging object %s: %s", key, self._why(exc))

    async def presign(self, uri: str, expires_s: int = 3600) -> str | None:
        if not uri.startswith("s3://"):
            return None
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        if not bucket or not key:
            raise ValueError(f"{uri!r} names no object")
        if not 1 <= expires_s <= MAX_PRESIGN_S:
            raise ValueError(f"a presigned URL lasts 1 s to {MAX_PRESIGN_S} s, not {expires_s}")
        with self._errors("presign GetObject"):
            return await self._s3.generate_presigned_url(
                "get_object", Params={"Bucket": bucket, "Key": key}, ExpiresIn=expires_s
            )

    @contextlib.contextmanager
    def _errors(self, operation: str) -> Iterator[None]:
        try:
            yield
        except (BotoCoreError, ClientError, aiohttp.ClientError) as exc:
            retryable = not isinstance(exc, NoCredentialsError)
            if isinstance(exc, ClientError):
                retryable = exc.response.get("Error", {}).get("Code") not in PERMANENT_CODES
            # `from None`: botocore's exception would travel into Temporal's failure otherwise.
            raise StoreError(
                f"S3 {operation} failed: {self._why(exc)}", retryable=retryable
            ) from None

    def _why(self, exc: BaseException) -> str:
        if isinstance(exc, ClientError):
            error = exc.response.get("Error", {})
            status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", "?")
            text = f"{error.get('Code', '?')} (HTTP {status}) {error.get('Message', '')}".strip()
        elif isinstance(exc, NoCredentialsError):
            text = "no credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
        else:
            text = f"{type(exc).__name__}: {exc}"
        for secret in self._secrets:  # belt and braces: S3's messages do not quote them
            text = text.replace(secret, "***")
        return text[:300]


def _staging_key(key: str) -> str:
    folder, _, base = key.rpartition("/")
    return f"{folder}/.{base}.{uuid.uuid4().hex[:12]}.part"


@contextlib.asynccontextmanager
async def open_output_store(settings: OutputSettings) -> AsyncIterator[OutputStore]:
    """The store the settings choose, with one S3 client for its whole life (the worker opens it
    once, like its httpx client)."""
    if settings.SPILLWAY_OUTPUT_URL is None:
        yield LocalOutputStore(settings.SPILLWAY_OUTPUT_DIR)
        return
    config = AioConfig(
        connect_timeout=10,
        read_timeout=60,
        retries={"total_max_attempts": S3_ATTEMPTS, "mode": "standard"},
        signature_version="s3v4",
        # MinIO, R2 and SeaweedFS answer on one host: bucket.host names would not resolve.
        s3={"addressing_style": "path"} if settings.AWS_ENDPOINT_URL else None,
        # Checksums only where S3 requires them: several S3-compatible servers refuse the newer
        # default headers; the sha256 spillway records covers the whole body anyway.
        request_checksum_calculation="when_required",
        response_checksum_validation="when_required",
    )
    keys = (settings.AWS_ACCESS_KEY_ID, settings.AWS_SECRET_ACCESS_KEY, settings.AWS_SESSION_TOKEN)
    key_id, secret, token = (k.get_secret_value() if k else None for k in keys)
    async with get_session().create_client(
        "s3",
        region_name=settings.AWS_REGION,
        endpoint_url=settings.AWS_ENDPOINT_URL,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        aws_session_token=token,
        config=config,
    ) as client:
        secrets = tuple(s for s in (key_id, secret, token) if s)
        yield S3OutputStore(client, settings.bucket, settings.prefix, secrets)
