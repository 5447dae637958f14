"""GPU admission (docs/design.md, "GPU admission"): the GPU pool handing out places and holding
the line, with a real `python worker.py` (its agent in process), the doubles in a process of
their own and the Temporal dev server.

    .venv/bin/python bench/admission.py [--jobs 30] [--line 2000] [--armed 50]

1. A backlog: `--jobs` local jobs at once on a ComfyUI double whose renders take 2 s, two places
   (A40_MAX_JOBS=2). Prints place freed -> the next job's POST /prompt, p50 / p99 (the pool
   hearing the give-back, in its history, to the admitted job's comfyui_submit starting, in the
   job's), and the card's idle gap between two renders, p99 (ComfyUI's own execution_success of
   one prompt to execution_start of the next, from its /history).
2. A long line: `--line` local jobs wait behind one that renders for an hour (A40_MAX_JOBS=1).
   Prints the worker's RSS per waiting job (its growth from just before the line), the Temporal
   server's CPU while they wait against idle (30 s each), and `--armed` armed jobs' decision
   p50 / p99 (start to the spend_reserve their cloud route schedules first) with the place taken
   and nobody in line, then behind the line, in the same run, each next to as many job-shaped
   workflows at once (bench/bare_workflow.py: the job's steps as no-op activities, no pool)
   reaching their third step, where a job decides. `--cache N` (repeatable) sets the worker's
   SPILLWAY_MAX_CACHED_WORKFLOWS for this part; `--jobs 0` skips the backlog.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client
from temporalio.testing import WorkflowEnvironment
from temporalio.worker import Worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import itertools

from bench.backlog import count
from bench.bare_workflow import JobShapedWorkflow, noop
from bench.common import (
    child_pid,
    cpu_s,
    rss_mb,
    run_main,
    start_dev_server,
    start_doubles,
    start_worker,
)
from spillway.client.jobs import submit
from spillway.client.queue import pool_view
from spillway.core import names
from spillway.core.hosts import WAITS_SUFFIX
from spillway.core.models import CloudRequest, VideoJob
from tests.support.graphs import VIDEO_GRAPH
from tests.support.waiting import until
from worker import POLLING, WORKFLOW_RUNNER

ARMED = {"CLOUD_VIDEO_FALLBACK_ENABLED": "1", "MINIMAX_POLL_INTERVAL_S": "2"}


def how_it_went(jobs: list[Decided], shaped: list[Decided]) -> str:
    def both(part: Callable[[Decided], float], scale: float = 1000) -> str:
        armed, bare = (statistics.median(part(d) for d in ds) * scale for ds in (jobs, shaped))
        return f"{armed:.0f} / {bare:.0f}"

    def steps(ds: list[Decided]) -> str:
        kinds = sorted({name for d in ds for name in d.activities})
        return ", ".join(
            f"{name} {statistics.median(d.activities.get(name, (0, 0))[0] for d in ds) * 1000:.0f}"
            f" + {statistics.median(d.activities.get(name, (0, 0))[1] for d in ds) * 1000:.0f}"
            for name in kinds
        )

    return (
        f"workflow tasks {both(lambda d: d.tasks, 1)}; ms waiting to be matched "
        f"{both(lambda d: d.matched_s)}, running {both(lambda d: d.running_s)}, on activities "
        f"and the pool {both(lambda d: d.s - d.matched_s - d.running_s)} (of it the pool's round "
        f"trip {both(lambda d: d.pool_s)})\n"
        f"    each activity, ms waiting to be matched + running: armed {steps(jobs)}; "
        f"job-shaped {steps(shaped)}"
    )


def q(values: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[98]


async def start_jobs(client: Client, queue: str, jobs: list[VideoJob]) -> None:
    for at in range(0, len(jobs), 100):
        await asyncio.gather(*(submit(client, job, queue) for job in jobs[at : at + 100]))


def local_jobs(kind: str, n: int) -> list[VideoJob]:
    return [
        VideoJob(job_id=f"{kind}-{i:04d}-{uuid.uuid4().hex[:6]}", graph=VIDEO_GRAPH)
        for i in range(n)
    ]


async def freed_to_post_s(client: Client, queue: str, ids: list[str]) -> list[float]:
    """For every job admitted because a place was given back: the pool hearing that give-back
    to the job's comfyui_submit starting."""
    asked: dict[str, datetime] = {}
    freed_by: dict[str, datetime] = {}
    last_back: datetime | None = None
    async for event in client.get_workflow_handle(names.pool_id(queue)).fetch_history_events():
        at = event.event_time.ToDatetime()
        signal = event.workflow_execution_signaled_event_attributes
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            body = json.loads(signal.input.payloads[0].data)
            if signal.signal_name == names.POOL_LEAVE:
                last_back = at
            else:
                asked.setdefault(body["job_id"], at)
        sent = event.signal_external_workflow_execution_initiated_event_attributes
        if event.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
            job = sent.workflow_execution.workflow_id
            answer = json.loads(sent.input.payloads[0].data)
            if answer.get("host") and last_back is not None and last_back > asked.get(job, at):
                freed_by[job] = last_back
    gaps = []
    for job in ids:
        if job not in freed_by:
            continue
        scheduled: dict[int, str] = {}
        async for event in client.get_workflow_handle(job).fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                name = event.activity_task_scheduled_event_attributes.activity_type.name
                scheduled[event.event_id] = name
            started = event.activity_task_started_event_attributes
            if (
                event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
                and scheduled.get(started.scheduled_event_id) == names.COMFYUI_SUBMIT
            ):
                gaps.append((event.event_time.ToDatetime() - freed_by[job]).total_seconds())
                break
    return gaps


async def idle_gaps_s(comfyui: str) -> list[float]:
    """ComfyUI's own record: each prompt's execution_start and execution_success, in ms."""
    async with httpx.AsyncClient() as http:
        history = (await http.get(f"{comfyui}/history")).json()
    runs = []
    for item in history.values():
        marks = {kind: data["timestamp"] for kind, data in item["status"]["messages"]}
        runs.append((marks["execution_start"], marks["execution_success"]))
    runs.sort()
    return [(nxt[0] - end) / 1000 for (_, end), nxt in itertools.pairwise(runs)]


async def backlog(env: WorkflowEnvironment, jobs: int) -> None:
    client = env.client
    sims, urls = await start_doubles(execution_s=2.0)
    queue = f"adm-{uuid.uuid4()}"
    worker = await start_worker(env, queue, urls, A40_MAX_JOBS="2")
    try:
        await asyncio.sleep(3)
        batch = local_jobs("backlog", jobs)
        await start_jobs(client, queue, batch)
        ids = [j.job_id for j in batch]
        started = time.perf_counter()
        while await count(client, queue, "completed") < jobs:
            if time.perf_counter() - started > 20 + 3 * jobs:
                raise SystemExit("the backlog never drained")
            await asyncio.sleep(1)
        freed = await freed_to_post_s(client, queue, ids)
        gaps = await idle_gaps_s(urls["comfyui"])
    finally:
        worker.kill()
        sims.kill()
    f50, f99 = q(freed)
    g50, g99 = q(gaps)
    print(f"{jobs} local jobs at once, renders of 2 s, 2 places (A40_MAX_JOBS=2)")
    print(
        f"  place freed -> next POST /prompt   p50 {f50:6.3f} s   p99 {f99:6.3f} s  ({len(freed)})"
    )
    print(f"  card idle between two renders     p50 {g50:6.3f} s   p99 {g99:6.3f} s  ({len(gaps)})")


async def armed_decisions(client: Client, queue: str, armed: int) -> list[Decided]:
    """`armed` armed jobs at once; the seconds from each one's start to its decision."""
    cloud = CloudRequest(prompt="a lighthouse at dusk")
    ids = [f"armed-{n:03d}-{uuid.uuid4().hex[:6]}" for n in range(armed)]
    done = await count(client, queue, "running_cloud") + await count(client, queue, "completed")
    await start_jobs(
        client, queue, [VideoJob(job_id=i, graph=VIDEO_GRAPH, cloud=cloud) for i in ids]
    )
    started = time.perf_counter()
    while (
        await count(client, queue, "running_cloud") + await count(client, queue, "completed")
        < done + armed
    ):
        if time.perf_counter() - started > 600:
            raise SystemExit("the armed jobs never reached the cloud")
        await asyncio.sleep(0.5)
    return [await decided_job(client, i) for i in ids]


async def shaped_decisions(client: Client, n: int) -> list[Decided]:
    """`n` job-shaped workflows at once, run as the job's worker runs workflows, on queues of
    their own: from each one's start to its third step scheduled (a job decides after its
    policy read and its probe)."""
    queue = f"shaped-{uuid.uuid4()}"
    host_queue = f"{queue}-gpu"
    like_the_worker: dict[str, Any] = {**POLLING, "workflow_runner": WORKFLOW_RUNNER}
    workers = [
        Worker(
            client,
            task_queue=queue,
            workflows=[JobShapedWorkflow],
            activities=[noop],
            disable_eager_activity_execution=True,
            **like_the_worker,
        ),
        *(
            Worker(client, task_queue=q, activities=[noop], **like_the_worker)
            for q in (host_queue, host_queue + WAITS_SUFFIX)
        ),
    ]
    async with contextlib.AsyncExitStack() as running:
        for worker in workers:
            await running.enter_async_context(worker)
        handles = await asyncio.gather(
            *(
                client.start_workflow(
                    JobShapedWorkflow.run, host_queue, id=f"shaped-{uuid.uuid4()}", task_queue=queue
                )
                for _ in range(n)
            )
        )
        await asyncio.gather(*(h.result() for h in handles))
    return [await decided_shaped(client, h.id) for h in handles]


@dataclass
class Decided:
    """A workflow's start to its decision (a job's first `spend_reserve`, a job-shaped one's
    third step), and how that time went: its workflow tasks waiting to be matched, running, and
    the rest, waiting on its activities; and each activity's time waiting to be matched and
    running, by its type (summed where a type ran more than once); and a job's round trip to
    the GPU pool (its ask sent to the pool's answer received), which the rest includes."""

    s: float
    tasks: int
    matched_s: float
    running_s: float
    activities: dict[str, tuple[float, float]]
    pool_s: float = 0.0


def decided(events: Sequence[HistoryEvent], at_decision: Callable[[HistoryEvent], bool]) -> Decided:
    start = events[0].event_time.ToDatetime()
    scheduled = started = start
    tasks, matched, running = 0, 0.0, 0.0
    names_at: dict[int, tuple[str, datetime]] = {}
    activities: dict[str, tuple[float, float]] = {}
    began: dict[int, datetime] = {}
    asked: datetime | None = None
    pool = 0.0
    for e in events:
        at = e.event_time.ToDatetime()
        if at_decision(e):
            return Decided((at - start).total_seconds(), tasks, matched, running, activities, pool)
        if e.event_type == EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
            asked = at
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED and asked:
            pool += (at - asked).total_seconds()
            asked = None
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            names_at[e.event_id] = (
                e.activity_task_scheduled_event_attributes.activity_type.name,
                at,
            )
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            began[e.activity_task_started_event_attributes.scheduled_event_id] = at
        elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sid = e.activity_task_completed_event_attributes.scheduled_event_id
            name, asked = names_at[sid]
            was = activities.get(name, (0.0, 0.0))
            activities[name] = (
                was[0] + (began[sid] - asked).total_seconds(),
                was[1] + (at - began[sid]).total_seconds(),
            )
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled = at
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            matched += (at - scheduled).total_seconds()
            started = at
        elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            running += (at - started).total_seconds()
            tasks += 1
    raise SystemExit(f"{events[0]} never decided")


async def decided_job(client: Client, job_id: str) -> Decided:
    def reserve(e: HistoryEvent) -> bool:
        return (
            e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.activity_task_scheduled_event_attributes.activity_type.name == names.SPEND_RESERVE
        )

    return decided((await client.get_workflow_handle(job_id).fetch_history()).events, reserve)


async def decided_shaped(client: Client, workflow_id: str) -> Decided:
    steps = 0

    def third(e: HistoryEvent) -> bool:
        nonlocal steps
        steps += e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        return steps == 3

    return decided((await client.get_workflow_handle(workflow_id).fetch_history()).events, third)


async def long_line(env: WorkflowEnvironment, line: int, armed: int, cache: int) -> None:
    client = env.client
    sims, urls = await start_doubles(execution_s=3600)
    queue = f"adm-{uuid.uuid4()}"
    worker = await start_worker(
        env, queue, urls, A40_MAX_JOBS="1", SPILLWAY_MAX_CACHED_WORKFLOWS=str(cache), **ARMED
    )
    server = child_pid("temporal")
    try:
        await asyncio.sleep(5)
        idle_rss = rss_mb(worker.pid)
        before = cpu_s(server)
        await asyncio.sleep(30)
        idle_cpu = (cpu_s(server) - before) / 30
        await start_jobs(client, queue, local_jobs("holder", 1))
        await until(lambda: count(client, queue, "running_local"), bool, what="the holder")
        alone = await armed_decisions(client, queue, armed)  # the place taken, nobody in line
        shaped_alone = await shaped_decisions(client, armed)
        # Per waiting job, from what the worker held just before the line: the idle figure
        # still lacks what the first jobs of each route load (modules, clients, schemas).
        before_rss = rss_mb(worker.pid)
        await start_jobs(client, queue, local_jobs("line", line))
        started = time.perf_counter()
        while await count(client, queue, "queued") < line:
            if time.perf_counter() - started > 1200:
                raise SystemExit("the line never formed")
            await asyncio.sleep(2)
        formed_s = time.perf_counter() - started
        await asyncio.sleep(10)  # what was under way settles
        in_line = len((await pool_view(client, queue)).line)
        line_rss = rss_mb(worker.pid)
        before = cpu_s(server)
        await asyncio.sleep(30)
        line_cpu = (cpu_s(server) - before) / 30
        decisions = await armed_decisions(client, queue, armed)
        shaped_behind = await shaped_decisions(client, armed)
    finally:
        worker.kill()
        sims.kill()
    per_job_kb = (line_rss - before_rss) * 1024 / line
    print(
        f"{line} local jobs in line behind one rendering for an hour (A40_MAX_JOBS=1), "
        f"SPILLWAY_MAX_CACHED_WORKFLOWS={cache}"
    )
    print(f"  the line formed in {formed_s:.0f} s; the pool holds {in_line} in line")
    print(
        f"  worker RSS   idle {idle_rss:6.1f} MB   before the line {before_rss:6.1f} MB   "
        f"line {line_rss:6.1f} MB   "
        f"{per_job_kb:5.1f} KB/job"
    )
    print(
        f"  server CPU   idle {idle_cpu * 100:5.1f} % of a core   line {line_cpu * 100:5.1f} %   "
        f"difference {(line_cpu - idle_cpu) * 100:+5.1f} points"
    )
    for where, jobs, shaped in (
        ("nobody in line", alone, shaped_alone),
        ("behind the line", decisions, shaped_behind),
    ):
        j50, j99 = q([d.s for d in jobs])
        s50, s99 = q([d.s for d in shaped])
        print(
            f"  {armed} at once, {where:15}  armed jobs' decision p50 {j50:5.2f} s  "
            f"p99 {j99:5.2f} s;  job-shaped third step p50 {s50:5.2f} s  p99 {s99:5.2f} s;  "
            f"p99 ratio {j99 / s99:4.2f}"
        )
        print(f"    up to it, median of each (armed / job-shaped): {how_it_went(jobs, shaped)}")


async def main(jobs: int, line: int, armed: int, caches: list[int], server_defaults: bool) -> None:
    env = await start_dev_server(server_defaults)
    print(f"one worker (agent in process), {os.cpu_count()} cores, dev server")
    if jobs:
        await backlog(env, jobs)
    for cache in caches if line else []:
        await long_line(env, line, armed, cache)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=30, help="the backlog on 2 s renders (30)")
    parser.add_argument("--line", type=int, default=2000, help="jobs in the long line (2000)")
    parser.add_argument("--armed", type=int, default=50, help="armed jobs behind it (50)")
    parser.add_argument(
        "--cache",
        type=int,
        action="append",
        help="the worker's SPILLWAY_MAX_CACHED_WORKFLOWS for the long line; repeat to compare "
        "(default: 4000, the worker's)",
    )
    parser.add_argument(
        "--server-defaults",
        action="store_true",
        help="the dev server's own dynamic config (transfer queue read 20 times a second, not 100)",
    )
    args = parser.parse_args()
    run_main(main(args.jobs, args.line, args.armed, args.cache or [4000], args.server_defaults))
