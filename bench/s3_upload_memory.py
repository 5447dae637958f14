"""Memory of the S3 output store: stream one large body (default 1 GiB) into an S3-compatible
server (moto, on 127.0.0.1) and print the process's peak RSS growth (target < 50 MB) and the
throughput.

    .venv/bin/python bench/s3_upload_memory.py [--mib 1024] [--through comfyui]

Plain: a generated body straight through `S3OutputStore.put`. `--through comfyui`: the real
download path, the `comfyui_download` activity fetching one output of the ComfyUI double from
/view into the store the worker would inject (httpx's stream, the part buffer, the sha256,
aiobotocore's requests). The servers run in child processes, so only the worker's side is
measured. The time includes the server-side copy that puts the object in place with its
sha256. Peak RSS is the kernel's VmHWM, reset just before the transfer through
/proc/self/clear_refs where the kernel allows it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
from temporalio.testing import ActivityEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.comfyui.activities import ComfyUIActivities
from activities.comfyui.models import ComfyUIDownload
from activities.storage.opening import open_output_store
from activities.storage.s3 import PART_BYTES
from activities.storage.store import OutputStore, StoredOutput
from bench.common import comfyui_finished, reset_peak, serve_comfyui, status_kib
from spillway.core.settings import Settings
from spillway.sim.comfyui_files import content_sha256, file_key
from tests.support.graphs import VIDEO_GRAPH
from tests.support.s3 import S3Endpoint, moto_server

MIB = 1024 * 1024
CHUNK = MIB  # what files.py reads from httpx at a time


def block() -> bytes:
    return random.Random(1).randbytes(CHUNK)


async def generated(size: int) -> AsyncIterator[bytes]:
    """`size` bytes without holding them: one 1 MiB block, sent again and again."""
    data = block()
    for start in range(0, size, CHUNK):
        yield data[: min(CHUNK, size - start)]


def expected_sha256(size: int) -> str:
    data, digest = block(), hashlib.sha256()
    for start in range(0, size, CHUNK):
        digest.update(data[: min(CHUNK, size - start)])
    return digest.hexdigest()


def serve() -> None:
    with moto_server() as url:
        print(url, flush=True)
        sys.stdin.read()  # until the parent closes it


@dataclass(frozen=True)
class Measured:
    out: StoredOutput
    expected_sha256: str
    metadata_sha256: str
    stored_bytes: int
    seconds: float
    rss_before_kib: int
    peak_kib: int
    peak_was_reset: bool


class Meter:
    """`start()` just before the transfer: resets the peak, notes RSS and the time."""

    def __init__(self) -> None:
        self.reset, self.before_kib, self.started = False, 0, 0.0

    def start(self) -> None:
        self.reset = reset_peak()
        self.before_kib = status_kib("VmRSS") if self.reset else status_kib("VmHWM")
        self.started = time.perf_counter()


Transfer = Callable[[OutputStore, Meter], Awaitable[tuple[StoredOutput, str]]]


async def measured(url: str, transfer: Transfer) -> Measured:
    """Runs `transfer` (the stored output and the sha256 it must have) into a fresh bucket,
    measuring the worker's RSS from its `meter.start()` on."""
    endpoint = S3Endpoint(url=url, bucket="spillway-bench")
    async with endpoint.client() as client:
        await client.create_bucket(Bucket=endpoint.bucket)
        async with open_output_store(endpoint.settings()) as store:
            # One small put first: the client's connections and models are loaded, as in a worker.
            await store.put("bench-warmup", "w.bin", generated(1000), 1000)
            meter = Meter()
            out, expected = await transfer(store, meter)
            elapsed = time.perf_counter() - meter.started
            peak = status_kib("VmHWM")
        head = await client.head_object(Bucket=endpoint.bucket, Key=out.path)
    metadata = head["Metadata"].get("sha256", "")
    stored = head["ContentLength"]
    return Measured(out, expected, metadata, stored, elapsed, meter.before_kib, peak, meter.reset)


def plain_put(size: int) -> Transfer:
    async def transfer(store: OutputStore, meter: Meter) -> tuple[StoredOutput, str]:
        meter.start()
        out = await store.put("bench-upload", "big.mp4", generated(size), size)
        return out, expected_sha256(size)

    return transfer


def comfyui_download(comfyui_url: str) -> Transfer:
    async def transfer(store: OutputStore, meter: Meter) -> tuple[StoredOutput, str]:
        # The store is injected, as the worker does: the settings only name ComfyUI.
        settings = Settings(COMFYUI_URL=comfyui_url, COMFYUI_HISTORY_POLL_S=0.2)
        environment, job = ActivityEnvironment(), "bench-download"
        async with httpx.AsyncClient() as http:
            acts = ComfyUIActivities(http, settings, store=store)
            finished = await comfyui_finished(environment, acts, job, VIDEO_GRAPH)
            meter.start()  # only the download counts
            downloaded = await environment.run(
                acts.download, ComfyUIDownload(job_id=job, files=finished.files)
            )
            await acts.aclose()
        [file], [output] = finished.files, downloaded.outputs
        key = file_key(file.type, file.subfolder, file.filename)
        out = StoredOutput(
            uri=output.uri or "", path=output.path, bytes=output.bytes, sha256=output.sha256
        )
        return out, content_sha256(key, output.bytes)

    return transfer


def report(size: int, through: str, m: Measured) -> None:
    verified = m.out.sha256 == m.metadata_sha256 == m.expected_sha256
    verified = verified and m.out.bytes == m.stored_bytes == size
    growth_mb = (m.peak_kib - m.rss_before_kib) / 1024
    what = {
        "put": "S3OutputStore.put of one generated",
        "comfyui": "comfyui_download (ComfyUI double /view -> S3) of one",
    }[through]
    print(f"{what} {size / MIB:.0f} MiB body into moto (S3 over HTTP)")
    print(
        f"  object        {m.out.uri}: {m.out.bytes} bytes in {PART_BYTES // MIB} MiB parts, "
        f"sha256 {'verified' if verified else 'MISMATCH'}"
    )
    print(f"  time          {m.seconds:.2f} s = {size / m.seconds / 1e6:.0f} MB/s")
    print(
        f"  worker RSS    {m.rss_before_kib / 1024:.0f} MB before, peak {m.peak_kib / 1024:.0f} MB"
    )
    note = "" if m.peak_was_reset else "  (peak not resettable here: growth over the earlier peak)"
    print(f"  peak growth   {growth_mb:.1f} MB (target < 50 MB){note}")


@contextlib.contextmanager
def child(*args: str) -> Iterator[str]:
    """A server in a child process of this script; yields the URL it prints."""
    process = subprocess.Popen(
        [sys.executable, __file__, *args], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert process.stdout is not None
        yield process.stdout.readline().strip()
    finally:
        assert process.stdin is not None
        process.stdin.close()
        process.terminate()
        process.wait(timeout=30)


def measure(size: int, through: str) -> None:
    with child("--serve") as s3_url:
        if through == "put":
            report(size, through, asyncio.run(measured(s3_url, plain_put(size))))
            return
        with child("--serve-comfyui", str(size)) as comfyui_url:
            transfer = comfyui_download(comfyui_url)
            report(size, through, asyncio.run(measured(s3_url, transfer)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="size of the body (MiB)")
    parser.add_argument("--through", choices=("put", "comfyui"), default="put")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--serve-comfyui", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
    elif args.serve_comfyui is not None:
        asyncio.run(serve_comfyui(args.serve_comfyui))
    else:
        measure(args.mib * MIB, args.through)


if __name__ == "__main__":
    main()
