"""Memory of the S3 output store: stream one large generated body (default 1 GiB) through
`S3OutputStore.put` into an S3-compatible server (moto, on 127.0.0.1) and print the process's
peak RSS growth (target < 50 MB) and the throughput.

    .venv/bin/python bench/s3_upload_memory.py [--mib 1024]

The server runs in a child process, so only the worker's side (the part buffer, the sha256,
aiobotocore's requests) is measured. The time includes the server-side copy that puts the
object in place with its sha256. Peak RSS is the kernel's VmHWM, reset just before the upload
through /proc/self/clear_refs where the kernel allows it.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import random
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.storage import PART_BYTES, StoredOutput, open_output_store
from tests.support.s3 import S3Endpoint, moto_server

MIB = 1024 * 1024
CHUNK = MIB  # what files.py reads from httpx at a time


def status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def reset_peak() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


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
    metadata_sha256: str
    stored_bytes: int
    seconds: float
    rss_before_kib: int
    peak_kib: int
    peak_was_reset: bool


async def upload(url: str, size: int) -> Measured:
    endpoint = S3Endpoint(url=url, bucket="spillway-bench")
    async with endpoint.client() as client:
        await client.create_bucket(Bucket=endpoint.bucket)
        async with open_output_store(endpoint.settings()) as store:
            # One small put first: the client's connections and models are loaded, as in a worker.
            await store.put("bench-warmup", "w.bin", generated(1000), 1000)
            reset = reset_peak()
            before = status_kib("VmRSS") if reset else status_kib("VmHWM")
            started = time.perf_counter()
            out = await store.put("bench-upload", "big.mp4", generated(size), size)
            elapsed = time.perf_counter() - started
            peak = status_kib("VmHWM")
        head = await client.head_object(Bucket=endpoint.bucket, Key="outputs/bench-upload/big.mp4")
    return Measured(
        out, head["Metadata"].get("sha256", ""), head["ContentLength"], elapsed, before, peak, reset
    )


def report(size: int, m: Measured) -> None:
    verified = m.out.sha256 == m.metadata_sha256 == expected_sha256(size)
    verified = verified and m.out.bytes == m.stored_bytes == size
    growth_mb = (m.peak_kib - m.rss_before_kib) / 1024
    print(f"S3OutputStore.put of one {size / MIB:.0f} MiB body into moto (S3 over HTTP)")
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


def measure(size: int) -> None:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        report(size, asyncio.run(upload(url, size)))
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait(timeout=30)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="size of the body (MiB)")
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve()
    else:
        measure(args.mib * MIB)


if __name__ == "__main__":
    main()
