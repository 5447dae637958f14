"""The output store against a real S3-compatible server (moto on 127.0.0.1) and a local folder:
a large body goes up in parts and lands whole with its sha256, a presigned URL serves it, a
failure leaves nothing behind, a re-run is harmless, and no credential appears in any error."""

from __future__ import annotations

import hashlib
import logging
import random
import traceback
import uuid
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from activities.storage import local
from activities.storage import s3 as s3_module
from activities.storage.local import LocalOutputStore
from activities.storage.opening import LazyOutputStore, open_output_store, presign, s3_location
from activities.storage.s3 import S3OutputStore
from activities.storage.store import IncompleteDownload, StoreError, UnsafeName
from spillway.core.errors import ConfigError
from spillway.core.settings import Settings, load_settings

if TYPE_CHECKING:
    from tests.support.s3 import S3Endpoint

pytest_plugins = ["tests.support.s3"]  # the `s3` fixture: moto on 127.0.0.1, a fresh bucket

MIB = 1 << 20


def body(size: int, seed: int = 7) -> bytes:
    return random.Random(seed).randbytes(size)


async def stream(data: bytes, chunk: int = 777_777, fail_after: int | None = None):
    """`data` in uneven chunks (part boundaries fall inside them); raises after `fail_after`
    bytes, like a ComfyUI download that drops."""
    for start in range(0, len(data), chunk):
        if fail_after is not None and start >= fail_after:
            raise ConnectionResetError("the source went away")
        yield data[start : start + chunk]


def job() -> str:
    return f"job-{uuid.uuid4().hex[:8]}"


async def held_keys(s3: S3Endpoint) -> list[str]:
    async with s3.client() as client:
        listed = await client.list_objects_v2(Bucket=s3.bucket)
    return sorted(obj["Key"] for obj in listed.get("Contents", []))


async def open_uploads(s3: S3Endpoint) -> list[str]:
    async with s3.client() as client:
        listed = await client.list_multipart_uploads(Bucket=s3.bucket)
    return [upload["Key"] for upload in listed.get("Uploads", [])]


async def stored(s3: S3Endpoint, key: str) -> tuple[bytes, dict[str, str], str]:
    async with s3.client() as client:
        got = await client.get_object(Bucket=s3.bucket, Key=key)
        async with got["Body"] as data:
            content = await data.read()
    return content, got["Metadata"], got["ContentType"]


def every_text(exc: BaseException) -> str:
    """The error as a log line, a traceback and Temporal's failure would show it."""
    return "\n".join([str(exc), repr(exc), *traceback.format_exception(exc)])


# --- S3 ------------------------------------------------------------------------------------


async def test_a_20_mib_video_goes_up_in_parts_and_lands_whole_with_its_sha256(s3: S3Endpoint):
    data, job_id = body(20 * MIB), job()
    calls: list[str] = []
    async with s3.client() as client:
        # Watch the requests this client sends (the client itself is the real one).
        client.meta.events.register("before-call.s3.*", lambda model, **_: calls.append(model.name))
        store = S3OutputStore(client, s3.bucket, "outputs")
        progress: list[tuple[int, int | None]] = []
        out = await store.put(
            job_id, "video/clip_00001.mp4", stream(data), len(data), lambda *p: progress.append(p)
        )

    key = f"outputs/{job_id}/video/clip_00001.mp4"
    assert (out.uri, out.path) == (f"s3://{s3.bucket}/{key}", key)
    assert out.output_file().uri == out.uri  # what a job's plan shows
    assert (out.bytes, out.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert calls.count("UploadPart") == 3  # 8 + 8 + 4 MiB, one at a time
    content, metadata, content_type = await stored(s3, key)
    assert hashlib.sha256(content).hexdigest() == out.sha256
    assert metadata == {"sha256": out.sha256}
    assert content_type == "video/mp4"
    assert await held_keys(s3) == [key]  # the staging object is gone
    assert await open_uploads(s3) == []
    assert progress[-1] == (len(data), len(data))


async def test_a_small_output_goes_up_in_one_put_with_its_sha256(s3: S3Endpoint):
    data, job_id = body(100_000), job()
    async with open_output_store(s3.settings(prefix="")) as store:
        out = await store.put(job_id, "frame.png", stream(data, chunk=4096))
    assert out.uri == f"s3://{s3.bucket}/{job_id}/frame.png"
    content, metadata, content_type = await stored(s3, f"{job_id}/frame.png")
    assert content == data
    assert metadata == {"sha256": hashlib.sha256(data).hexdigest()}
    assert content_type == "image/png"


async def test_an_empty_output_is_stored_too(s3: S3Endpoint):
    async with open_output_store(s3.settings()) as store:
        out = await store.put(job(), "empty.txt", stream(b""))
    assert (out.bytes, out.sha256) == (0, hashlib.sha256(b"").hexdigest())


async def test_the_presigned_url_downloads_the_same_bytes_with_plain_http(
    s3: S3Endpoint, http: httpx.AsyncClient
):
    data = body(9 * MIB, seed=3)
    async with open_output_store(s3.settings()) as store:
        out = await store.put(job(), "clip.mp4", stream(data), len(data))
        url = await store.presign(out.uri, expires_s=300)
    assert url is not None and url.startswith(s3.url)
    assert s3.secret_access_key not in url
    response = await http.get(url)
    assert response.status_code == 200, response.text[:300]
    assert hashlib.sha256(response.content).hexdigest() == out.sha256
    assert response.headers["content-type"] == "video/mp4"


async def test_a_source_failing_mid_stream_aborts_the_upload_and_stores_nothing(s3: S3Endpoint):
    data, job_id = body(20 * MIB), job()
    async with open_output_store(s3.settings()) as store:
        with pytest.raises(ConnectionResetError):
            await store.put(job_id, "clip.mp4", stream(data, fail_after=17 * MIB))
    assert await held_keys(s3) == []
    assert await open_uploads(s3) == []


async def test_a_body_shorter_than_announced_is_refused_and_stores_nothing(s3: S3Endpoint):
    data = body(12 * MIB)
    async with open_output_store(s3.settings()) as store:
        with pytest.raises(IncompleteDownload, match="ended at 12582912 of 13631488"):
            await store.put(job(), "clip.mp4", stream(data), len(data) + MIB)
        with pytest.raises(IncompleteDownload):
            await store.put(job(), "small.mp4", stream(b"x" * 10), 11)
    assert await held_keys(s3) == []
    assert await open_uploads(s3) == []


async def test_a_rerun_overwrites_the_same_key_and_clears_what_a_dead_worker_left(
    s3: S3Endpoint,
):
    data, job_id = body(17 * MIB, seed=11), job()
    key = f"outputs/{job_id}/clip.mp4"
    async with s3.client() as client:
        # A worker killed mid-upload leaves an unfinished upload and maybe a staging object.
        await client.create_multipart_upload(
            Bucket=s3.bucket, Key=f"outputs/{job_id}/.clip.mp4.0123456789ab.part"
        )
        await client.put_object(
            Bucket=s3.bucket, Key=f"outputs/{job_id}/.clip.mp4.ba9876543210.part", Body=b"half"
        )
    async with open_output_store(s3.settings()) as store:
        first = await store.put(job_id, "clip.mp4", stream(data), len(data))
        again = await store.put(job_id, "clip.mp4", stream(data, chunk=MIB), len(data))
    assert again == first
    assert await held_keys(s3) == [key]
    assert await open_uploads(s3) == []
    content, metadata, _ = await stored(s3, key)
    assert hashlib.sha256(content).hexdigest() == metadata["sha256"] == first.sha256


async def test_an_object_over_the_copy_limit_is_put_in_place_range_by_range(
    s3: S3Endpoint, monkeypatch: pytest.MonkeyPatch
):
    # S3 copies at most 5 GiB in one request; the same path, scaled down.
    monkeypatch.setattr(s3_module, "SINGLE_COPY_LIMIT", 10 * MIB)
    monkeypatch.setattr(s3_module, "COPY_PART_BYTES", 6 * MIB)
    data, job_id = body(20 * MIB, seed=5), job()
    async with open_output_store(s3.settings()) as store:
        out = await store.put(job_id, "clip.mp4", stream(data), len(data))
    content, metadata, content_type = await stored(s3, f"outputs/{job_id}/clip.mp4")
    assert content == data
    assert metadata == {"sha256": out.sha256}
    assert content_type == "video/mp4"
    assert await open_uploads(s3) == []


async def test_names_that_would_escape_the_job_prefix_are_refused(s3: S3Endpoint, tmp_path: Path):
    async with open_output_store(s3.settings()) as s3_store:
        for store in (s3_store, LocalOutputStore(tmp_path)):
            for job_id, name in [
                ("../other", "clip.mp4"),
                ("job-1", "../clip.mp4"),
                ("job-1", "/etc/passwd"),
                ("job-1", "video//clip.mp4"),
                ("job-1", ".clip.mp4.0123456789ab.part"),
                ("job-1", "a\\b.mp4"),
            ]:
                with pytest.raises(UnsafeName):
                    await store.put(job_id, name, stream(b"x"))
    assert await held_keys(s3) == []
    assert not any(tmp_path.iterdir())  # noqa: ASYNC240


# --- credentials ---------------------------------------------------------------------------


async def test_credentials_appear_in_no_error_and_no_log_line(
    s3: S3Endpoint,
    refused_url: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
):
    caplog.set_level(logging.INFO)
    credentials = (s3.access_key_id, s3.secret_access_key)
    monkeypatch.setattr(s3_module, "S3_ATTEMPTS", 1)  # a refused port: no botocore retries
    errors: list[BaseException] = []
    data = body(9 * MIB)

    async with open_output_store(s3.settings(prefix="")) as store:
        with pytest.raises(ConnectionResetError) as dropped:
            await store.put(job(), "clip.mp4", stream(data, fail_after=8 * MIB))
        errors.append(dropped.value)
    missing = replace(s3, bucket="spillway-no-such-bucket")
    async with open_output_store(missing.settings()) as store:
        with pytest.raises(StoreError, match="NoSuchBucket") as no_bucket:
            await store.put(job(), "clip.mp4", stream(data))
        assert not no_bucket.value.retryable  # only a change of settings helps
        errors.append(no_bucket.value)
    async with open_output_store(s3.settings(AWS_ENDPOINT_URL=refused_url)) as store:
        with pytest.raises(StoreError, match="EndpointConnectionError") as refused:
            await store.put(job(), "clip.mp4", stream(data))
        assert refused.value.retryable
        errors.append(refused.value)
    for bad in (
        {"SPILLWAY_OUTPUT_URL": f"s3://{s3.access_key_id}:{s3.secret_access_key}@bucket/x"},
        {"AWS_ENDPOINT_URL": f"http://{s3.access_key_id}:{s3.secret_access_key}@127.0.0.1:9000"},
    ):
        for name, value in (s3.env() | bad).items():
            monkeypatch.setenv(name, value)
        with pytest.raises(ConfigError, match="credentials belong in AWS_") as config:
            s3_location(load_settings())
        errors.append(config.value)

    for error in errors:
        for credential in credentials:
            assert credential not in every_text(error)
    assert not [r for r in caplog.records if any(c in r.getMessage() for c in credentials)]


def test_the_output_url_is_checked_with_a_one_line_error(monkeypatch: pytest.MonkeyPatch):
    for name in ("SPILLWAY_OUTPUT_URL", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION"):
        monkeypatch.delenv(name, raising=False)
    assert s3_location(Settings()) is None
    assert s3_location(Settings(SPILLWAY_OUTPUT_URL="")) is None
    good = Settings(SPILLWAY_OUTPUT_URL="s3://my-bucket//videos/spillway/")
    assert s3_location(good) == ("my-bucket", "videos/spillway")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-3")
    assert Settings().AWS_REGION == "eu-west-3"
    for url, says in [
        ("s3://My_Bucket/x", "'My_Bucket' is not a bucket name"),
        ("s3://my-bucket/../x", "may not contain '.' or '..'"),
        ("s3://my-bucket/x?versionId=1", "without '?' or '#'"),
    ]:
        with pytest.raises(ConfigError, match="SPILLWAY_OUTPUT_URL") as exc:
            s3_location(Settings(SPILLWAY_OUTPUT_URL=url))
        assert says in str(exc.value) and "\n" not in str(exc.value)


# --- the local folder ----------------------------------------------------------------------


async def test_the_local_store_writes_the_job_folder_like_today(tmp_path: Path):
    data, job_id = body(3 * MIB), job()
    async with open_output_store(Settings(SPILLWAY_OUTPUT_DIR=tmp_path)) as store:
        assert await store.find(job_id, "video/clip.mp4") is None
        out = await store.put(job_id, "video/clip.mp4", stream(data), len(data))
        assert await store.presign(out.uri) is None
        assert await store.find(job_id, "video/clip.mp4") == out
        again = await store.put(job_id, "video/clip.mp4", stream(data, chunk=MIB), len(data))
        with pytest.raises(IncompleteDownload):
            await store.put(job_id, "short.mp4", stream(data), len(data) + 1)
        with pytest.raises(ConnectionResetError):
            await store.put(job_id, "dropped.mp4", stream(data, fail_after=MIB))

    target = tmp_path.resolve() / job_id / "video" / "clip.mp4"  # noqa: ASYNC240
    assert out == again
    assert (out.path, out.uri) == (str(target), target.as_uri())
    assert out.output_file().uri is None  # a local output: its path says where it is
    assert (out.bytes, out.sha256) == (len(data), hashlib.sha256(data).hexdigest())
    assert target.read_bytes() == data
    assert local.describe(target).sha256 == out.sha256
    # Nothing else: no partial files, nothing under the refused names.
    left = [p.relative_to(tmp_path) for p in tmp_path.rglob("*") if p.is_file()]  # noqa: ASYNC240
    assert left == [Path(job_id, "video", "clip.mp4")]


async def test_the_local_store_reads_back_only_files_under_its_own_folder(tmp_path: Path):
    store = LocalOutputStore(tmp_path / "outputs")
    out = await store.put("job-1", "inputs/a.png", stream(b"png bytes"))
    assert await store.read(out.uri, limit=100) == b"png bytes"
    with pytest.raises(StoreError, match="over 5") as large:
        await store.read(out.uri, limit=5)
    assert not large.value.retryable
    secret = tmp_path / "secret.txt"
    secret.write_text("not for a job")
    for uri in (secret.as_uri(), "file:///etc/passwd", "https://example.com/a.png"):
        with pytest.raises(StoreError) as refused:
            await store.read(uri, limit=100)
        assert not refused.value.retryable


# --- finding, reading, presigning, opening lazily ------------------------------------------


async def test_a_finished_object_is_found_by_its_sha256_and_an_unfinished_one_is_not(
    s3: S3Endpoint,
):
    data, job_id = body(9 * MIB, seed=2), job()
    async with open_output_store(s3.settings()) as store:
        assert await store.find(job_id, "clip.mp4") is None
        out = await store.put(job_id, "clip.mp4", stream(data), len(data))
        assert await store.find(job_id, "clip.mp4") == out
        async with s3.client() as client:  # an object spillway did not finish has no sha256
            await client.put_object(Bucket=s3.bucket, Key=f"outputs/{job_id}/x.mp4", Body=b"x")
        assert await store.find(job_id, "x.mp4") is None


async def test_the_s3_store_reads_back_only_objects_under_its_prefix(s3: S3Endpoint):
    async with open_output_store(s3.settings()) as store:
        out = await store.put(job(), "inputs/frame.png", stream(b"\x89PNG frame"))
        assert await store.read(out.uri, limit=100) == b"\x89PNG frame"
        with pytest.raises(StoreError, match="over 3"):
            await store.read(out.uri, limit=3)
        for uri in (f"s3://other-bucket/outputs/{job()}/a.png", f"s3://{s3.bucket}/elsewhere/a"):
            with pytest.raises(StoreError, match="is not under") as refused:
                await store.read(uri, limit=100)
            assert not refused.value.retryable


async def test_presign_for_the_cli_signs_an_s3_uri_and_returns_none_for_a_local_one(
    s3: S3Endpoint, http: httpx.AsyncClient, tmp_path: Path
):
    settings = s3.settings()
    async with open_output_store(settings) as store:
        out = await store.put(job(), "clip.mp4", stream(b"video"))
    url = await presign(settings, out.uri, 60)
    assert url is not None and s3.secret_access_key not in url
    assert (await http.get(url)).content == b"video"
    assert await presign(settings, (tmp_path / "a.mp4").as_uri()) is None
    with pytest.raises(ValueError, match="lasts 1 s to"):
        await presign(settings, out.uri, 8 * 86400)


async def test_a_lazy_store_opens_at_first_use_and_says_what_is_wrong_with_its_settings(
    s3: S3Endpoint, tmp_path: Path
):
    lazy = LazyOutputStore(s3.settings())
    out = await lazy.put(job(), "a.txt", stream(b"hello"))
    assert await lazy.read(out.uri, 10) == b"hello"
    await lazy.aclose()
    await lazy.aclose()  # twice is harmless
    broken = LazyOutputStore(Settings(SPILLWAY_OUTPUT_URL="s3://No_Bucket"))
    with pytest.raises(StoreError, match="not a bucket name") as exc:
        await broken.find("job-1", "a.txt")
    assert not exc.value.retryable
