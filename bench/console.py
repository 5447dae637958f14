"""The studio console under a long line (issue 64): a real `python worker.py` with its agent,
the doubles in a process of their own, the Temporal dev server, two renders of an hour on two
places and `--line` local jobs waiting behind them; the console in this process on uvicorn.

    .venv/bin/python bench/console.py [--line 2000] [--reads 50] [--loads 5]

Prints `GET /api/queue` and `GET /api/board` p50 / p95 over `--reads` reads one after another
(what one open page asks every 1.5 s), and the page's load time in headless Chromium (navigation
to the line drawn, `--loads` times). The aim: /api/queue p95 within 1 s.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.admission import local_jobs, start_jobs
from bench.backlog import count
from bench.common import run_main, start_dev_server, start_doubles, start_worker
from tests.support.browser import chromium_page
from tests.support.console import console_app, serving_console
from tests.support.waiting import until


def q(values: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[94]


async def reads_s(http: httpx.AsyncClient, url: str, n: int) -> list[float]:
    took = []
    for _ in range(n):
        started = time.perf_counter()
        answer = await http.get(url)
        answer.raise_for_status()
        took.append(time.perf_counter() - started)
    return took


async def main(line: int, reads: int, loads: int) -> None:
    env = await start_dev_server()
    client = env.client
    sims, urls = await start_doubles(execution_s=3600)
    queue = f"console-{uuid.uuid4()}"
    worker = await start_worker(env, queue, urls, A40_MAX_JOBS="2")
    try:
        await start_jobs(client, queue, local_jobs("render", 2))
        await until(lambda: count(client, queue, "running_local"), lambda n: n == 2, timeout_s=300)
        started = time.perf_counter()
        await start_jobs(client, queue, local_jobs("line", line))
        while await count(client, queue, "queued") < line:
            if time.perf_counter() - started > 1800:
                raise SystemExit("the line never formed")
            await asyncio.sleep(2)
        formed_s = time.perf_counter() - started
        app, _ = console_app(client, queue, Path(tempfile.mkdtemp(prefix="spillway-console-")))
        async with serving_console(app) as url, httpx.AsyncClient(timeout=60) as http:
            shown = (await http.get(f"{url}/api/queue")).json()
            queue_s = await reads_s(http, f"{url}/api/queue", reads)
            board_s = await reads_s(http, f"{url}/api/board", reads)
            page_s = []
            async with chromium_page() as page:
                for _ in range(loads):
                    await page.goto("about:blank")
                    began = time.perf_counter()
                    await page.call("Page.navigate", url=url)
                    await page.until(
                        "document.querySelectorAll('#line tbody tr').length > 0 && "
                        "document.querySelectorAll('#renders tbody tr').length === 2",
                        timeout_s=120,
                    )
                    page_s.append(time.perf_counter() - began)
    finally:
        worker.kill()
        sims.kill()
        await env.shutdown()
    print(f"the console, {os.cpu_count()} cores, dev server, one worker (agent in process)")
    print(
        f"  {line} local jobs in line behind 2 renders (formed in {formed_s:.0f} s); "
        f"/api/queue shows {len(shown['line'])} in line"
    )
    for what, took in (("GET /api/queue", queue_s), ("GET /api/board", board_s)):
        p50, p95 = q(took)
        print(f"  {what:15} p50 {p50 * 1000:7.1f} ms   p95 {p95 * 1000:7.1f} ms   ({reads} reads)")
    print(
        f"  the page, navigation to the line drawn: median {statistics.median(page_s):.2f} s, "
        f"slowest {max(page_s):.2f} s ({loads} loads)"
    )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--line", type=int, default=2000, help="jobs waiting in line (2000)")
    parser.add_argument("--reads", type=int, default=50, help="reads of each API route (50)")
    parser.add_argument("--loads", type=int, default=5, help="page loads in Chromium (5)")
    args = parser.parse_args()
    run_main(main(args.line, args.reads, args.loads))
