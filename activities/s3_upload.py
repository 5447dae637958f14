"""What S3OutputStore.put (activities/s3_store.py) is made of: the body cut into parts, the
multipart upload to a staging key, the server-side copy into place, the clearing of what a killed
worker left, and S3's errors as StoreError with no credential in them."""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterator
from typing import TYPE_CHECKING, TypedDict, Unpack

import aiohttp
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from activities import files
from activities.storage import Progress, StoreError

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_s3.type_defs import (
        CompletedPartTypeDef,
        CopySourceTypeDef,
        CreateMultipartUploadRequestTypeDef,
    )

log = logging.getLogger("spillway.storage")

MIB = 1 << 20
# One part in memory at a time (plus the chunk being added): ~2 parts of RSS per upload.
PART_BYTES = 8 * MIB
MAX_PARTS = 10_000  # S3's limit: 8 MiB parts reach 78 GiB; a size hint raises the part size
SINGLE_COPY_LIMIT = 5 << 30  # CopyObject's limit; larger objects are copied range by range
COPY_PART_BYTES = 512 * MIB
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
S3_ERRORS = (BotoCoreError, ClientError, aiohttp.ClientError)


class Meter:
    def __init__(self, progress: Progress | None, total: int | None) -> None:
        self._progress, self._total = progress, total
        self.done, self._last = 0, 0.0

    def add(self, n: int) -> None:
        self.done += n
        if self._progress and time.monotonic() - self._last >= files.PROGRESS_EVERY_S:
            self._last = time.monotonic()
            self._progress(self.done, self._total)

    def check(self) -> None:
        if self._total is not None and self.done != self._total:
            raise files.IncompleteDownload(self.done, self._total)

    def finish(self) -> None:
        if self._progress:
            self._progress(self.done, self.done)


async def cut_parts(
    chunks: AsyncIterable[bytes], size: int, digest: hashlib._Hash, meter: Meter
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


def part_size(size_hint: int | None) -> int:
    if not size_hint:
        return PART_BYTES
    needed = -(-size_hint // MAX_PARTS)
    return max(PART_BYTES, -(-needed // MIB) * MIB)


def staging_key(key: str) -> str:
    folder, _, base = key.rpartition("/")
    return f"{folder}/.{base}.{uuid.uuid4().hex[:12]}.part"


class FinalObject(TypedDict):
    """An object under its final key as this store writes it: its sha256 in the metadata marks
    it finished (PutObject, CopyObject and a large copy's CreateMultipartUpload all take this)."""

    Bucket: str
    Key: str
    ContentType: str
    Metadata: dict[str, str]


class _UploadRef(TypedDict):
    Bucket: str
    Key: str
    UploadId: str


class _PartRef(_UploadRef):
    PartNumber: int


class _Parts:
    """The parts sent so far of one multipart upload, numbered in the order they are added."""

    def __init__(self, upload: _UploadRef) -> None:
        self.upload = upload
        self.done: list[CompletedPartTypeDef] = []

    def next_part(self) -> _PartRef:
        return {**self.upload, "PartNumber": len(self.done) + 1}

    def add(self, part: _PartRef, etag: str) -> None:
        self.done.append({"ETag": etag, "PartNumber": part["PartNumber"]})


class S3Bucket:
    """One bucket through one client: the multipart uploads and copies, and the error mapping."""

    def __init__(
        self, client: S3Client, bucket: str, prefix: str, secrets: tuple[str, ...] = ()
    ) -> None:
        self._s3, self._bucket, self._prefix = client, bucket, prefix.strip("/")
        self._secrets = tuple(s for s in secrets if s)

    def _final(self, key: str, content_type: str, sha256: str) -> FinalObject:
        return {
            "Bucket": self._bucket,
            "Key": key,
            "ContentType": content_type,
            "Metadata": {"sha256": sha256},
        }

    async def _upload(
        self,
        key: str,
        held: list[bytes],
        parts: AsyncIterator[bytes],
        meter: Meter,
        content_type: str,
    ) -> None:
        """A multipart upload of the part in `held` and the rest of `parts`, one in memory at a
        time."""
        async with self._multipart(Bucket=self._bucket, Key=key, ContentType=content_type) as up:
            part: bytes | None = held.pop()
            while part is not None:
                at = up.next_part()
                if at["PartNumber"] > MAX_PARTS:
                    raise StoreError(
                        f"the body needs more than {MAX_PARTS} parts: pass its size as size_hint",
                        retryable=False,
                    )
                with self._errors("UploadPart"):
                    sent = await self._s3.upload_part(**at, Body=part)
                up.add(at, sent["ETag"])
                part = None  # let it go before the next one is read
                part = await anext(parts, None)
            meter.check()

    @contextlib.asynccontextmanager
    async def _multipart(
        self, **create: Unpack[CreateMultipartUploadRequestTypeDef]
    ) -> AsyncIterator[_Parts]:
        """A multipart upload, created now; the parts the block adds to it are completed when it
        ends, and it is aborted on any failure, cancellation included, so none is left to bill."""
        with self._errors("CreateMultipartUpload"):
            created = await self._s3.create_multipart_upload(**create)
        up = _Parts(
            {"Bucket": create["Bucket"], "Key": create["Key"], "UploadId": created["UploadId"]}
        )
        try:
            yield up
            with self._errors("CompleteMultipartUpload"):
                await self._s3.complete_multipart_upload(
                    **up.upload, MultipartUpload={"Parts": up.done}
                )
        except BaseException:
            await self._abort_quietly(create["Key"], up.upload["UploadId"])
            raise

    async def _place(self, staging: str, final: FinalObject, size: int) -> None:
        """Server-side copy of the staging object to its final key (no bytes travel)."""
        source: CopySourceTypeDef = {"Bucket": self._bucket, "Key": staging}
        if size <= SINGLE_COPY_LIMIT:
            with self._errors("CopyObject"):
                await self._s3.copy_object(**final, CopySource=source, MetadataDirective="REPLACE")
            return
        async with self._multipart(**final) as up:
            for start in range(0, size, COPY_PART_BYTES):
                end = min(start + COPY_PART_BYTES, size) - 1
                at = up.next_part()
                with self._errors("UploadPartCopy"):
                    copied = await self._s3.upload_part_copy(
                        **at, CopySource=source, CopySourceRange=f"bytes={start}-{end}"
                    )
                up.add(at, copied["CopyPartResult"]["ETag"])

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
        except S3_ERRORS as exc:
            # The next put of this output aborts it again; a bucket lifecycle rule is the net.
            log.warning("could not abort an upload to %s: %s", key, self._why(exc))

    async def _delete_quietly(self, key: str) -> None:
        try:
            await self._s3.delete_object(Bucket=self._bucket, Key=key)
        except S3_ERRORS as exc:
            log.warning("could not delete the staging object %s: %s", key, self._why(exc))

    @contextlib.contextmanager
    def _errors(self, operation: str) -> Iterator[None]:
        try:
            yield
        except S3_ERRORS as exc:
            # `from None`: botocore's exception would travel into Temporal's failure otherwise.
            raise self._failure(operation, exc) from None

    def _failure(self, operation: str, exc: BaseException) -> StoreError:
        retryable = not isinstance(exc, NoCredentialsError)
        if isinstance(exc, ClientError):
            retryable = exc.response.get("Error", {}).get("Code") not in PERMANENT_CODES
        return StoreError(f"S3 {operation} failed: {self._why(exc)}", retryable=retryable)

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
