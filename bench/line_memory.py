"""Where a waiting job's memory goes: `--line` local jobs in the GPU line behind one job that
holds the only place (its ComfyUI double paused), the worker in this process so that Python's
allocation tracing sees it, the Temporal dev server.

    .venv/bin/python bench/line_memory.py [--line 2000] [--cache 4000] [--gc-full-after 1000]
                                          [--trace] [--by-line] [--floor]

Prints the worker's RSS growth per waiting job (from just before the line to the line formed),
the unreachable objects a full collection of Python's cyclic GC then finds (workflows the SDK
evicted from its cache, waiting for a full collection), and with `--trace` the Python
allocations per waiting job by file (`--by-line`: by the line that allocated them). The
worker's GC is set up as `worker.py` sets it, with `--gc-full-after` collections of the middle
generation before a full one (the worker's 1,000; Python's default is 10).

`--floor` then measures the same way, in the same process, as many `WaitingWorkflow`s
(bench/bare_workflow.py: a job's input, three no-op steps, a wait for a signal beside a timer)
on a worker of their own with the same cache, pollers and runner: what the SDK holds for a
waiting workflow of that shape, whatever spillway keeps.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import logging
import sys
import tempfile
import tracemalloc
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from temporalio import activity
from temporalio.client import Client
from temporalio.worker import Worker

from bench.bare_workflow import WaitingWorkflow
from bench.common import run_main, start_dev_server
from spillway.client.jobs import submit
from spillway.client.queue import pool_view
from spillway.core.errors import Failed
from spillway.core.models import VideoJob
from spillway.core.tiers import load_tiers
from tests.support.a40 import FakeGpu
from tests.support.comfyui import ComfyUIDouble
from tests.support.constants import FREE_VRAM_PCT
from tests.support.graphs import VIDEO_GRAPH
from tests.support.settings import comfyui_values, make_settings
from tests.support.waiting import until
from worker import POLLING, WORKFLOW_RUNNER, fewer_full_collections, serving


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024
    raise SystemExit("no VmRSS in /proc/self/status")


steps_done: list[int] = [0, 0, 0]


@activity.defn(name="bench_noop")
async def counted_noop(step: int) -> int:
    """bench/bare_workflow.py's no-op step, counted: the floor's workflows wait once each has
    taken its third."""
    steps_done[step] += 1
    return step


async def waiting_floor(client: Client, n: int, cache: int) -> None:
    queue = f"floor-{uuid.uuid4()}"
    worker = Worker(
        client,
        task_queue=queue,
        workflows=[WaitingWorkflow],
        activities=[counted_noop],
        max_cached_workflows=cache,
        workflow_runner=WORKFLOW_RUNNER,
        **POLLING,
    )

    async def start(kind: str, count: int) -> None:
        for at in range(0, count, 50):
            await asyncio.gather(
                *(
                    client.start_workflow(
                        WaitingWorkflow.run,
                        VIDEO_GRAPH,
                        id=f"{kind}-{i}-{uuid.uuid4().hex[:6]}",
                        task_queue=queue,
                    )
                    for i in range(at, min(count, at + 50))
                )
            )

    async def waiting() -> int:
        return steps_done[2]

    async with worker:
        await start("warm", 20)
        await until(waiting, lambda k: k == 20, timeout_s=120, what="the first 20 waiting")
        await asyncio.sleep(3)
        gc.collect()
        before = rss_mb()
        await start("floor", n)
        await until(waiting, lambda k: k == 20 + n, timeout_s=1800, every_s=2, what="the floor")
        await asyncio.sleep(3)  # each one's task after its third step completes
        formed = rss_mb()
        garbage = gc.collect()
        print(f"{n} WaitingWorkflows waiting (the floor), max_cached_workflows={cache}")
        print(
            f"  worker RSS {before:6.1f} -> {formed:6.1f} MB: "
            f"{(formed - before) * 1024 / n:6.1f} KiB a waiting workflow"
        )
        print(f"  a full collection then found {garbage} unreachable objects")


async def main(
    line: int, cache: int, full_after: int, trace: bool, by_line: bool, floor: bool
) -> None:
    logging.disable(logging.ERROR)  # the worker's log: its figures only
    env = await start_dev_server()
    async with ComfyUIDouble() as comfyui:
        comfyui.set_vram_used_pct(FREE_VRAM_PCT)
        comfyui.pause()  # the holder's prompt never ends: its place stays taken
        settings = make_settings(
            comfyui_values(comfyui, Path(tempfile.mkdtemp(prefix="spillway-bench-"))),
            SPILLWAY_TASK_QUEUE=f"mem-{uuid.uuid4()}",
            A40_MAX_JOBS=1,
            SPILLWAY_MAX_CACHED_WORKFLOWS=cache,
        )
        queue, client = settings.SPILLWAY_TASK_QUEUE, env.client

        async def in_line() -> int:
            try:
                return len((await pool_view(client, queue)).line)
            except Failed:  # the pool is busy with the burst: ask again
                return -1

        async def jobs(kind: str, n: int) -> None:
            for at in range(0, n, 50):
                await asyncio.gather(
                    *(
                        submit(
                            client,
                            VideoJob(
                                job_id=f"{kind}-{i}-{uuid.uuid4().hex[:6]}", graph=VIDEO_GRAPH
                            ),
                            queue,
                        )
                        for i in range(at, min(n, at + 50))
                    )
                )

        tiers = load_tiers(settings.SPILLWAY_ROUTING_TIERS)
        async with serving(client, settings, tiers, gpu=FakeGpu()):
            fewer_full_collections(full_after)
            await jobs("holder", 1)
            await jobs("warm", 20)  # every step a waiting job takes, once, before measuring
            await until(in_line, lambda n: n == 20, timeout_s=120, what="the first 20 in line")
            gc.collect()
            before = rss_mb()
            if trace:
                tracemalloc.start()
                traced = tracemalloc.take_snapshot()
            await jobs("line", line)
            await until(
                in_line, lambda n: n == 20 + line, timeout_s=1800, every_s=2, what="the line"
            )
            await asyncio.sleep(3)  # what was under way settles
            formed = rss_mb()
            garbage = gc.collect()
            print(
                f"{line} local jobs in line, SPILLWAY_MAX_CACHED_WORKFLOWS={cache}, "
                f"a full collection after {full_after} of the middle generation"
            )
            print(
                f"  worker RSS {before:6.1f} -> {formed:6.1f} MB: "
                f"{(formed - before) * 1024 / line:6.1f} KiB a waiting job"
            )
            print(f"  a full collection then found {garbage} unreachable objects")
            if trace:
                group = "lineno" if by_line else "filename"
                stats = tracemalloc.take_snapshot().compare_to(traced, group)
                total = sum(s.size_diff for s in stats)
                print(f"  Python's allocations: {total / line / 1024:.1f} KiB a waiting job")
                for s in stats[: 20 if by_line else 12]:
                    frame = s.traceback[0]
                    name = frame.filename.split("site-packages/")[-1]
                    at = f":{frame.lineno}" if by_line else ""
                    print(f"    {s.size_diff / line / 1024:6.2f} KiB  {name}{at}")
            if trace:
                tracemalloc.stop()
            if floor:
                await waiting_floor(client, line, cache)
            comfyui.resume()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--line", type=int, default=2000)
    parser.add_argument("--cache", type=int, default=4000, help="the workflow cache (4000)")
    parser.add_argument("--gc-full-after", type=int, default=1000)
    parser.add_argument("--trace", action="store_true", help="Python's allocations by file")
    parser.add_argument("--by-line", action="store_true", help="with --trace: by line")
    parser.add_argument(
        "--floor",
        action="store_true",
        help="then as many bare workflows waiting as a job waits, on a worker of their own",
    )
    args = parser.parse_args()
    run_main(main(args.line, args.cache, args.gc_full_after, args.trace, args.by_line, args.floor))
