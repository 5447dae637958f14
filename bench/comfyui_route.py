"""Throughput of the LOCAL route: N jobs (default 200) through VideoJobWorkflow with the real
activities against the ComfyUI double (instant execution, in a process of its own), next to a
bare workflow running the same number of no-op activities, in this process, on the same dev
server and with the worker's pollers (`worker.POLLING`).

    .venv/bin/python bench/comfyui_route.py [--jobs 200] [--rounds 3]

The bare workflow runs three ways: as Temporal runs it by default, where the server hands each
activity to the worker in its answer to the workflow task that scheduled it (eager dispatch, as
the activity's queue is the workflow's); with eager dispatch off, so that every activity is
matched to a poll as a job's are; and as `JobShapedWorkflow`, its activities on a GPU host's
queue and waits queue with a LOCAL job's timeouts, retry policies and priority (a job's probe
and ComfyUI activities run on its host's queues, never eagerly). The baselines' workers run
workflows as the job's worker does (`worker.WORKFLOW_RUNNER`, unsandboxed).

After ten unmeasured runs of each (imports, caches), the three kinds take turns for `--rounds`
rounds, so that a shared machine's moods fall on all of them alike. Prints jobs/s for each and
the ratios, as the median and each round's, p50/p99 from the job's start to ComfyUI's POST
/prompt (server-side times from each job's history: start event to comfyui_submit completed),
and the median CPU time per job of each process for each: on a machine of few cores they share
the cores, so the ratio is the ratio of their CPU costs. Then one job of each kind at a time, ten
times: start to result, as one client sees a lone job. The GPU host has a place for every job
(A40_MAX_JOBS = --jobs): the jobs still ask the GPU pool for one and give it back, but never wait
in line.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bare_workflow import BareWorkflow, JobShapedWorkflow, noop
from bench.common import child_pid, cpu_s, run_main, start_dev_server, start_doubles
from spillway.client.jobs import submit
from spillway.core.hosts import WAITS_SUFFIX
from spillway.core.models import VideoJob
from spillway.core.settings import Settings
from spillway.core.tiers import load_tiers
from tests.support.graphs import VIDEO_GRAPH
from worker import POLLING, WORKFLOW_RUNNER, serving

# read_policy, a40_load_status, comfyui_submit, comfyui_wait, comfyui_download; a job also asks
# the GPU pool for a place by signal, hears the answer by signal and gives it back by signal.
STEPS = 5
ALONE = 10  # one-at-a-time runs of each kind


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


KINDS = ("eager", "matched", "shaped", "LOCAL")


@dataclass
class Round:
    """One run of `jobs` of one kind: its seconds, each process's CPU seconds, its handles."""

    seconds: float
    cpu: dict[str, float]
    handles: list[WorkflowHandle[Any, Any]]


async def main(jobs: int, rounds: int, server_defaults: bool) -> None:
    sims, urls = await start_doubles(execution_s=0)
    env = await start_dev_server(server_defaults)
    queue = f"bench-{uuid.uuid4()}"
    settings = Settings(
        SPILLWAY_TASK_QUEUE=queue,
        COMFYUI_URL=urls["comfyui"],
        SPILLWAY_OUTPUT_DIR=Path(tempfile.mkdtemp(prefix="spillway-bench-")),
        A40_GUARD_URL=None,
        MINIMAX_API_KEY=None,
        # A place for every job: this measures what the route costs, not the line's turns.
        A40_MAX_JOBS=max(jobs, 10),
    )
    tiers = load_tiers(settings.SPILLWAY_ROUTING_TIERS)
    # The baselines and their no-op activities in the same process, on queues of their own,
    # polled and run as the job's worker does.
    like_the_worker = {**POLLING, "workflow_runner": WORKFLOW_RUNNER}
    host_queue = f"{queue}-shaped-gpu"
    baseline_workers = [
        Worker(
            env.client,
            task_queue=f"{queue}-bare-{kind}",
            workflows=[BareWorkflow, JobShapedWorkflow],
            activities=[noop],
            disable_eager_activity_execution=kind != "eager",
            **like_the_worker,
        )
        for kind in KINDS[:3]
    ] + [
        Worker(env.client, task_queue=q, activities=[noop], **like_the_worker)
        for q in (host_queue, host_queue + WAITS_SUFFIX)
    ]
    processes = {
        "worker and bench": os.getpid(),
        "Temporal server": child_pid("temporal"),
        "doubles": sims.pid,
    }

    def cpu() -> dict[str, float]:
        return {name: cpu_s(pid) for name, pid in processes.items()}

    async def start(kind: str) -> WorkflowHandle[Any, Any]:
        if kind == "LOCAL":
            job = VideoJob(job_id=f"bench-{uuid.uuid4().hex[:12]}", graph=VIDEO_GRAPH)
            return await submit(env.client, job, queue)
        wid, on = f"bare-{uuid.uuid4()}", f"{queue}-bare-{kind}"
        if kind == "shaped":
            return await env.client.start_workflow(
                JobShapedWorkflow.run, host_queue, id=wid, task_queue=on
            )
        return await env.client.start_workflow(BareWorkflow.run, STEPS, id=wid, task_queue=on)

    async def run(kind: str, count: int) -> Round:
        cpu_before, started = cpu(), time.perf_counter()
        handles = [await start(kind) for _ in range(count)]
        results = await asyncio.gather(*(h.result() for h in handles))
        seconds, cpu_after = time.perf_counter() - started, cpu()
        if kind == "LOCAL":
            assert all(p.state == "completed" and p.route == "local" for p in results)
        return Round(seconds, {k: cpu_after[k] - cpu_before[k] for k in processes}, handles)

    async def alone(kind: str) -> float:
        """One job at a time: its start to its result, as a client sees it."""
        started = time.perf_counter()
        await (await start(kind)).result()
        return time.perf_counter() - started

    measured: dict[str, list[Round]] = {kind: [] for kind in KINDS}
    single: dict[str, list[float]] = {kind: [] for kind in KINDS}
    async with serving(env.client, settings, tiers), contextlib.AsyncExitStack() as workers:
        for worker in baseline_workers:
            await workers.enter_async_context(worker)
        for kind in KINDS:  # first runs pay for imports and caches: not measured
            await run(kind, 10)
        # Interleaved, so that the machine's mood of the moment falls on every kind alike.
        for _ in range(rounds):
            for kind in KINDS:
                measured[kind].append(await run(kind, jobs))
        for _ in range(ALONE):
            for kind in KINDS:
                single[kind].append(await alone(kind))

    def rates(kind: str) -> list[float]:
        return [jobs / r.seconds for r in measured[kind]]

    def listed(values: list[float], digits: int = 1) -> str:
        return ", ".join(f"{v:.{digits}f}" for v in values)

    def median_of(values: list[float], digits: int = 1) -> str:
        return f"{statistics.median(values):6.{digits}f}   ({listed(values, digits)})"

    local = rates("LOCAL")
    ratios = {k: [a / b for a, b in zip(local, rates(k), strict=True)] for k in KINDS[:3]}
    print(f"{jobs} jobs started back to back, {rounds} rounds interleaved; one worker; dev server;")
    print(f"{os.cpu_count()} cores. Median (each round):")
    print(f"  bare workflow, {STEPS} no-op activities, jobs/s")
    print(f"    eager dispatch (default)          {median_of(rates('eager'))}")
    print(f"    every activity matched            {median_of(rates('matched'))}")
    print(f"    on a job's queues, its options    {median_of(rates('shaped'))}")
    print(f"  VideoJobWorkflow, LOCAL route       {median_of(local)}")
    print(f"  ratio to bare, eager                {median_of(ratios['eager'], 2)}")
    print(f"  ratio to bare, matched              {median_of(ratios['matched'], 2)}")
    print(f"  ratio to bare, on a job's queues    {median_of(ratios['shaped'], 2)}")
    local_handles = [h for r in measured["LOCAL"] for h in r.handles]
    to_post = [await start_to_post_s(env.client, h) for h in local_handles]
    q = statistics.quantiles(to_post, n=100, method="inclusive")
    print(f"  start -> POST /prompt   p50 {q[49] * 1000:.0f} ms   p99 {q[98] * 1000:.0f} ms")
    alone_ms = {k: statistics.median(v) * 1000 for k, v in single.items()}
    print(f"  one job alone, start -> result, median of {ALONE}, ms")
    print("    " + "   ".join(f"{k} {alone_ms[k]:.0f}" for k in KINDS))
    print(f"    LOCAL / on a job's queues  {alone_ms['LOCAL'] / alone_ms['shaped']:.2f}")
    print("  CPU ms per job, median   eager matched shaped  LOCAL")
    for name in processes:
        ms = [statistics.median(1000 * r.cpu[name] / jobs for r in measured[k]) for k in KINDS]
        print(f"    {name:<20} " + " ".join(f"{m:7.1f}" for m in ms))
    if os.environ.get("BENCH_DETAIL"):
        await print_activity_times(env.client, local_handles)
    sims.terminate()
    await sims.wait()
    await env.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=200, help="jobs of each kind per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--server-defaults",
        action="store_true",
        help="the dev server's own dynamic config (transfer queue read 20 times a second, not 100)",
    )
    args = parser.parse_args()
    run_main(main(args.jobs, args.rounds, args.server_defaults))
