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
from collections.abc import AsyncIterable, AsyncIterator

from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import ClientError

from activities.s3_upload import (
    S3_ERRORS,
    Meter,
    S3Bucket,
    cut_parts,
    part_size,
    staging_key,
)
from activities.storage import (
    MAX_PRESIGN_S,
    OutputStore,
    StoredOutput,
    StoreError,
    Upload,
    folders,
)
from spillway.settings import Settings

log = logging.getLogger("spillway.storage")

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
