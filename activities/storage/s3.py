"""The output store on S3-compatible storage (`SPILLWAY_OUTPUT_URL=s3://bucket/prefix`; the
contract is store.py, the local folder local.py).

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
from typing import TYPE_CHECKING, TypedDict, Unpack

import aiohttp
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import BotoCoreError, ClientError, NoCredentialsError

from activities.storage.store import (
    MAX_PRESIGN_S,
    PROGRESS_EVERY_S,
    IncompleteDownload,
    OutputStore,
    Progress,
    StoredOutput,
    StoreError,
    Upload,
    folders,
)
from spillway.core.settings import Settings

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
        if self._progress and time.monotonic() - self._last >= PROGRESS_EVERY_S:
            self._last = time.monotonic()
            self._progress(self.done, self._total)

    def check(self) -> None:
        if self._total is not None and self.done != self._total:
            raise IncompleteDownload(self.done, self._total)

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


S3_ATTEMPTS = 5  # botocore's own retries of one request (a 503 on one part redoes only that part)


class S3OutputStore(S3Bucket, OutputStore):
    """`s3://<bucket>/<prefix>/<job id>/<name>`, with its sha256 as the `sha256` metadata."""

    def _key(self, job_id: str, name: str) -> str:
        return "/".join(([self._prefix] if self._prefix else []) + folders(job_id, name))

    def _stored(self, key: str, size: int, sha256: str) -> StoredOutput:
        return StoredOutput(uri=f"s3://{self._bucket}/{key}", path=key, bytes=size, sha256=sha256)

    async def _put(self, upload: Upload, chunks: AsyncIterable[bytes]) -> StoredOutput:
        key = self._key(upload.job_id, upload.name)
        content_type = mimetypes.guess_type(upload.name)[0] or "application/octet-stream"
        await self._clear_stale(key)
        part_bytes, digest = part_size(upload.size_hint), hashlib.sha256()
        meter = Meter(upload.progress, upload.size_hint)
        async with contextlib.aclosing(cut_parts(chunks, part_bytes, digest, meter)) as parts:
            first = await anext(parts)
            if len(first) < part_bytes:  # the whole body is in hand: one PUT, sha256 known
                meter.check()
                final = self._final(key, content_type, digest.hexdigest())
                with self._errors("PutObject"):
                    await self._s3.put_object(**final, Body=first)
            else:
                staging = staging_key(key)
                # Handed over in a list so that this frame does not keep the first part alive.
                held, first = [first], b""
                await self._upload(staging, held, parts, meter, content_type)
                try:
                    final = self._final(key, content_type, digest.hexdigest())
                    await self._place(staging, final, meter.done)
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
        except S3_ERRORS as exc:
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


@contextlib.asynccontextmanager
async def open_s3_store(
    settings: Settings, bucket: str, prefix: str
) -> AsyncIterator[S3OutputStore]:
    """One S3 client for the store's whole life."""
    endpoint = str(settings.AWS_ENDPOINT_URL).rstrip("/") if settings.AWS_ENDPOINT_URL else None
    keys = (settings.AWS_ACCESS_KEY_ID, settings.AWS_SECRET_ACCESS_KEY, settings.AWS_SESSION_TOKEN)
    key_id, secret, token = (k.get_secret_value() if k else None for k in keys)
    async with get_session().create_client(
        "s3",
        region_name=settings.AWS_REGION,
        endpoint_url=endpoint,
        aws_access_key_id=key_id,
        aws_secret_access_key=secret,
        aws_session_token=token,
        config=_config(endpoint),
    ) as client:
        secrets = tuple(s for s in (key_id, secret, token) if s)
        yield S3OutputStore(client, bucket, prefix, secrets)


def _config(endpoint: str | None) -> AioConfig:
    return AioConfig(
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
