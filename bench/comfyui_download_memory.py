"""Memory of the `comfyui_download` activity: fetch one large ComfyUI output (default 1 GiB)
from the ComfyUI double and print the worker process's peak RSS growth (target < 100 MB) and
the throughput.

    .venv/bin/python bench/comfyui_download_memory.py [--mib 1024]

The double runs in a child process, so only the worker's side (the activity, httpx, the file
write and the sha256) is measured. Peak RSS is the kernel's VmHWM, reset just before the download
through /proc/self/clear_refs where the kernel allows it.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from temporalio.testing import ActivityEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from activities.comfyui.activities import ComfyUIActivities
from activities.comfyui.models import ComfyUIDownload, ComfyUIFile
from bench.common import comfyui_finished, reset_peak, serve_comfyui, status_kib
from spillway.core.models import OutputFile
from spillway.core.settings import Settings
from spillway.sim.comfyui_files import content_sha256, file_key
from tests.support.graphs import VIDEO_GRAPH as TEST_GRAPH

MIB = 1024 * 1024
# The tests' video graph, saving under its own prefix.
VIDEO_GRAPH = copy.deepcopy(TEST_GRAPH)
VIDEO_GRAPH["3"]["inputs"]["filename_prefix"] = "video/big"


def measure(size: int) -> None:
    child = subprocess.Popen(
        [sys.executable, __file__, "--serve", str(size)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert child.stdout is not None
        url = child.stdout.readline().strip()
        with tempfile.TemporaryDirectory(prefix="spillway-bench-") as out:
            report(size, asyncio.run(download(url, Path(out))))
    finally:
        child.terminate()
        child.wait()


@dataclass(frozen=True)
class Measured:
    file: ComfyUIFile
    output: OutputFile
    seconds: float
    rss_before_kib: int
    peak_kib: int
    peak_was_reset: bool


async def download(url: str, out: Path) -> Measured:
    settings = Settings(COMFYUI_URL=url, SPILLWAY_OUTPUT_DIR=out, COMFYUI_HISTORY_POLL_S=0.2)
    environment = ActivityEnvironment()
    async with httpx.AsyncClient() as http:
        acts = ComfyUIActivities(http, settings)
        job = "bench-download"
        finished = await comfyui_finished(environment, acts, job, VIDEO_GRAPH)

        reset = reset_peak()
        before = status_kib("VmRSS") if reset else status_kib("VmHWM")
        started = time.perf_counter()
        downloaded = await environment.run(
            acts.download, ComfyUIDownload(job_id=job, files=finished.files)
        )
        elapsed = time.perf_counter() - started
        peak = status_kib("VmHWM")
    [file], [output] = finished.files, downloaded.outputs
    return Measured(file, output, elapsed, before, peak, reset)


def report(size: int, m: Measured) -> None:
    expected = content_sha256(file_key(m.file.type, m.file.subfolder, m.file.filename), size)
    on_disk = os.path.getsize(m.output.path)
    verified = m.output.sha256 == expected and m.output.bytes == size == on_disk
    growth_mb = (m.peak_kib - m.rss_before_kib) / 1024
    print(f"comfyui_download of one {size / MIB:.0f} MiB output from the ComfyUI double")
    print(
        f"  file          {m.file.subfolder}/{m.file.filename}: {m.output.bytes} bytes, "
        f"sha256 {'verified' if verified else 'MISMATCH'}"
    )
    print(f"  time          {m.seconds:.2f} s = {size / m.seconds / 1e6:.0f} MB/s")
    print(
        f"  worker RSS    {m.rss_before_kib / 1024:.0f} MB before, peak {m.peak_kib / 1024:.0f} MB"
    )
    note = "" if m.peak_was_reset else "  (peak not resettable here: growth over the earlier peak)"
    print(f"  peak growth   {growth_mb:.1f} MB (target < 100 MB){note}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024, help="size of the output (MiB)")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve is not None:
        asyncio.run(serve_comfyui(args.serve))
    else:
        measure(args.mib * MIB)


if __name__ == "__main__":
    main()
