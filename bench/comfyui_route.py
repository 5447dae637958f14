"""Throughput of the LOCAL route: N jobs (default 200) through VideoJobWorkflow with the real
activities against the ComfyUI double (instant execution, in a process of its own), next to a
bare workflow running the same number of no-op activities, in this process, on the same dev
server and with the worker's pollers (`worker.POLLING`).

    .venv/bin/python bench/comfyui_route.py [--jobs 200]

The bare workflow runs twice: as Temporal runs it by default, where the server hands each
activity to the worker in its answer to the workflow task that scheduled it (eager dispatch, as
the activity's queue is the workflow's), and with eager dispatch off, so that every activity is
matched to a poll as a job's are (a job's probe and ComfyUI activities run on its GPU host's
queues, never eagerly).

Prints jobs/s for each, the ratios, p50/p99 from the job's start to ComfyUI's POST /prompt
(server-side times from each job's history: start event to comfyui_submit completed), and the
CPU time per job of each process for each: on a machine of few cores they share the cores, so
the ratio is the ratio of their CPU costs.
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
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bare_workflow import BareWorkflow, noop
from bench.common import child_pid, cpu_s, run_main, start_dev_server, start_doubles
from spillway.jobs import submit
from spillway.models import VideoJob
from spillway.settings import Settings
from spillway.tiers import load_tiers
from tests.support.graphs import VIDEO_GRAPH
from worker import POLLING, serving

# read_policy (a local activity), a40_load_status, comfyui_submit, comfyui_wait, comfyui_download
STEPS = 5


async def start_to_post_s(client: Client, handle: WorkflowHandle[Any, Any]) -> float:
    history = await client.get_workflow_handle(handle.id).fetch_history()
    started = history.events[0].event_time.ToDatetime()
    scheduled: dict[int, str] = {}
    for event in history.events:
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            scheduled[event.event_id] = name
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attributes = event.activity_task_completed_event_attributes
            if scheduled.get(attributes.scheduled_event_id) == "comfyui_submit":
                return (event.event_time.ToDatetime() - started).total_seconds()
    raise AssertionError(f"{handle.id} never submitted")


async def print_activity_times(client: Client, handles: list[WorkflowHandle[Any, Any]]) -> None:
    """Mean scheduled -> started -> completed per activity type (BENCH_DETAIL=1)."""
    waits: dict[str, list[float]] = {}
    runs: dict[str, list[float]] = {}
    for handle in handles:
        history = await client.get_workflow_handle(handle.id).fetch_history()
        at: dict[int, tuple[str, datetime]] = {}
        started: dict[int, datetime] = {}
        for e in history.events:
            t = e.event_time.ToDatetime()
            if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                at[e.event_id] = (e.activity_task_scheduled_event_attributes.activity_type.name, t)
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                started[e.activity_task_started_event_attributes.scheduled_event_id] = t
            elif e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                sid = e.activity_task_completed_event_attributes.scheduled_event_id
                name, t0 = at[sid]
                waits.setdefault(name, []).append((started[sid] - t0).total_seconds())
                runs.setdefault(name, []).append((t - started[sid]).total_seconds())
    for name in waits:
        print(
            f"    {name:<24} queued {statistics.mean(waits[name]) * 1000:7.1f} ms"
            f"   ran {statistics.mean(runs[name]) * 1000:7.1f} ms"
        )


async def main(jobs: int) -> None:
    sims, urls = await start_doubles(execution_s=0)
    env = await start_dev_server()
    queue = f"bench-{uuid.uuid4()}"
    settings = Settings(
        SPILLWAY_TASK_QUEUE=queue,
        COMFYUI_URL=urls["comfyui"],
        SPILLWAY_OUTPUT_DIR=Path(tempfile.mkdtemp(prefix="spillway-bench-")),
        A40_GUARD_URL=None,
        MINIMAX_API_KEY=None,
    )
    tiers = load_tiers(settings.SPILLWAY_ROUTING_TIERS)
    # The bare workflow and its no-op activities in the same process, on queues of their own.
    bare_workers = {
        matched: Worker(
            env.client,
            task_queue=f"{queue}-bare-{matched}",
            workflows=[BareWorkflow],
            activities=[noop],
            disable_eager_activity_execution=matched,
            **POLLING,  # as the job's worker polls
        )
        for matched in (False, True)
    }
    processes = {
        "worker and bench": os.getpid(),
        "Temporal server": child_pid("temporal"),
        "doubles": sims.pid,
    }

    def cpu() -> dict[str, float]:
        return {name: cpu_s(pid) for name, pid in processes.items()}

    async with serving(env.client, settings, tiers), bare_workers[False], bare_workers[True]:
        cpu_at = [cpu()]
        bare_s = []
        for matched in (False, True):
            started = time.perf_counter()
            bare = [
                await env.client.start_workflow(
                    BareWorkflow.run,
                    STEPS,
                    id=f"bare-{uuid.uuid4()}",
                    task_queue=f"{queue}-bare-{matched}",
                )
                for _ in range(jobs)
            ]
            await asyncio.gather(*(h.result() for h in bare))
            bare_s.append(time.perf_counter() - started)
            cpu_at.append(cpu())

        started = time.perf_counter()
        handles = [
            await submit(env.client, VideoJob(job_id=job_id, graph=VIDEO_GRAPH), queue)
            for job_id in (f"bench-{uuid.uuid4().hex[:12]}" for _ in range(jobs))
        ]
        plans = await asyncio.gather(*(h.result() for h in handles))
        spillway_s = time.perf_counter() - started
        cpu_at.append(cpu())

    assert all(p.state == "completed" and p.route == "local" for p in plans)
    to_post = [await start_to_post_s(env.client, h) for h in handles]
    q = statistics.quantiles(to_post, n=100, method="inclusive")
    eager_rate, matched_rate = (jobs / s for s in bare_s)
    spillway_rate = jobs / spillway_s
    print(f"{jobs} jobs started back to back; one worker; dev server; {os.cpu_count()} cores")
    print(f"  bare workflow, {STEPS} no-op activities")
    print(f"    eager dispatch (default)          {eager_rate:6.1f} jobs/s  ({bare_s[0]:.1f} s)")
    print(f"    every activity matched            {matched_rate:6.1f} jobs/s  ({bare_s[1]:.1f} s)")
    print(
        f"  VideoJobWorkflow, LOCAL route       {spillway_rate:6.1f} jobs/s  ({spillway_s:.1f} s)"
    )
    print(f"  ratio to bare, eager                {spillway_rate / eager_rate:6.2f}")
    print(f"  ratio to bare, matched              {spillway_rate / matched_rate:6.2f}")
    print(f"  start -> POST /prompt   p50 {q[49] * 1000:.0f} ms   p99 {q[98] * 1000:.0f} ms")
    print("  CPU ms per job          eager matched  LOCAL")
    for name in processes:
        eager_ms, matched_ms, local_ms = (
            1000 * (b[name] - a[name]) / jobs for a, b in pairwise(cpu_at)
        )
        print(f"    {name:<20} {eager_ms:7.1f} {matched_ms:7.1f} {local_ms:7.1f}")
    if os.environ.get("BENCH_DETAIL"):
        await print_activity_times(env.client, handles)
    sims.terminate()
    await sims.wait()
    await env.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=200)
    run_main(main(parser.parse_args().jobs))
