"""The output store on S3-compatible storage (`SPILLWAY_OUTPUT_URL=s3://bucket/prefix`; the
protocol and the local folder are in activities/storage.py).

It sends one part at a time and keeps the store's promise that an object under its final key is
whole: S3 fixes an object's metadata when its upload starts, but the sha256 is known only at the
end, so a multipart upload goes to a hidden staging key first and a server-side copy puts it in
place with the sha256 (then the staging object is deleted). Bodies smaller than one part go up in
a single PUT. A re-run finds the finished object by its sha256 metadata (`find`) and keeps it;
uploads and staging objects left by a worker that died are cleared by the next put.

The bucket policy needs s3:PutObject, s3:GetObject (the copy reads the staging object, `find`
reads metadata, presigned URLs read outputs), s3:DeleteObject and s3:AbortMultipartUpload;
s3:ListBucket and s3:ListBucketMultipartUploads let a re-run clear what a killed worker left
(without them that is skipped, with a warning).
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import mimetypes
import re
import time
import uuid
from collections.abc import AsyncGenerator, AsyncIterable, AsyncIterator, Iterator
from typing import TYPE_CHECKING

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from activities import files
from activities.storage import (
    MAX_PRESIGN_S,
    Progress,
    StoredOutput,
    StoreError,
    folders,
)
from spillway.settings import Settings

if TYPE_CHECKING:
    from types_aiobotocore_s3 import S3Client
    from types_aiobotocore_s3.type_defs import CompletedPartTypeDef, CopySourceTypeDef

log = logging.getLogger("spillway.storage")

MIB = 1 << 20
# One part in memory at a time (plus the chunk being added): ~2 parts of RSS per upload.
PART_BYTES = 8 * MIB
MAX_PARTS = 10_000  # S3's limit: 8 MiB parts reach 78 GiB; a size hint raises the part size
SINGLE_COPY_LIMIT = 5 << 30  # CopyObject's limit; larger objects are copied range by range
COPY_PART_BYTES = 512 * MIB
S3_ATTEMPTS = 5  # botocore's own retries of one request (a 503 on one part redoes only that part)
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
_S3_ERRORS = (BotoCoreError, ClientError, aiohttp.ClientError)


class _Meter:
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
        return "/".join(([self._prefix] if self._prefix else []) + folders(job_id, name))

    def _stored(self, key: str, size: int, sha256: str) -> StoredOutput:
        return StoredOutput(uri=f"s3://{self._bucket}/{key}", path=key, bytes=size, sha256=sha256)

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
        return self._stored(key, meter.done, digest.hexdigest())

    async def find(self, job_id: str, name: str) -> StoredOutput | None:
        key = self._key(job_id, name)
        try:
            head = await self._s3.head_object(Bucket=self._bucket, Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise self._failure("HeadObject", exc) from None
        except _S3_ERRORS as exc:
            raise self._failure("HeadObject", exc) from None
        sha256 = head.get("Metadata", {}).get("sha256")
        # Without its sha256 it is not one this store finished: put it again.
        return None if sha256 is None else self._stored(key, head["ContentLength"], sha256)

    async def read(self, uri: str, limit: int) -> bytes:
        bucket, _, key = uri.removeprefix("s3://").partition("/")
        # Only this store's objects: a job's input names what the worker reads and sends on.
        mine = not self._prefix or key.startswith(self._prefix + "/")
        if not uri.startswith("s3://") or bucket != self._bucket or not mine:
            raise StoreError(
                f"{uri!r} is not under s3://{self._bucket}/{self._prefix}", retryable=False
            )
        with self._errors("GetObject"):
            got = await self._s3.get_object(Bucket=bucket, Key=key)
            if got["ContentLength"] > limit:
                got["Body"].close()
                raise StoreError(
                    f"{uri} is {got['ContentLength']} bytes, over {limit}", retryable=False
                )
            async with got["Body"] as body:
                return await body.read()

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
            await self._complete(key, upload_id, done)
        except BaseException:
            await self._abort_quietly(key, upload_id)
            raise

    async def _complete(self, key: str, upload_id: str, done: list[CompletedPartTypeDef]) -> None:
        with self._errors("CompleteMultipartUpload"):
            await self._s3.complete_multipart_upload(
                Bucket=self._bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": done}
            )

    async def _place(
        self, staging: str, key: str, size: int, sha256: str, content_type: str
    ) -> None:
        """Server-side copy of the staging object to `key` with its sha256 (no bytes travel)."""
        metadata = {"sha256": sha256}
        source: CopySourceTypeDef = {"Bucket": self._bucket, "Key": staging}
        if size <= SINGLE_COPY_LIMIT:
            with self._errors("CopyObject"):
                await self._s3.copy_object(
                    Bucket=self._bucket,
                    Key=key,
                    CopySource=source,
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
                        CopySource=source,
                        CopySourceRange=f"bytes={start}-{end}",
                    )
                done.append({"ETag": copied["CopyPartResult"]["ETag"], "PartNumber": number})
            await self._complete(key, upload_id, done)
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
        except _S3_ERRORS as exc:
            # The next put of this output aborts it again; a bucket lifecycle rule is the net.
            log.warning("could not abort an upload to %s: %s", key, self._why(exc))

    async def _delete_quietly(self, key: str) -> None:
        try:
            await self._s3.delete_object(Bucket=self._bucket, Key=key)
        except _S3_ERRORS as exc:
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
        except _S3_ERRORS as exc:
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


def _staging_key(key: str) -> str:
    folder, _, base = key.rpartition("/")
    return f"{folder}/.{base}.{uuid.uuid4().hex[:12]}.part"


@contextlib.asynccontextmanager
async def open_s3_store(
    settings: Settings, bucket: str, prefix: str
) -> AsyncIterator[S3OutputStore]:
    """One S3 client for the store's whole life."""
    endpoint = str(settings.AWS_ENDPOINT_URL).rstrip("/") if settings.AWS_ENDPOINT_URL else None
    config = AioConfig(
        connect_timeout=10,
        read_timeout=60,
        retries={"total_max_attempts": S3_ATTEMPTS, "mode": "standard"},
        signature_version="s3v4",
        # MinIO, R2 and SeaweedFS answer on one host: bucket.host names would not resolve.
        s3={"addressing_style": "path"} if endpoint else None,
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
        endpoint_url=endpoint,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        aws_session_token=token,
        config=config,
    ) as client:
        secrets = tuple(s for s in (key_id, secret, token) if s)
        yield S3OutputStore(client, bucket, prefix, secrets)
