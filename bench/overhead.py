"""Where a LOCAL job's overhead goes (issue 65): what one job costs in history events, workflow
tasks, activities, signals and upserts, its own and the GPU pool's, against the job-shaped
baseline of bench/comfyui_route.py (`JobShapedWorkflow`: the same five activities on a GPU
host's queues with a LOCAL job's options, no pool, no publication), and the CPU seconds per job
of each process.

    .venv/bin/python bench/overhead.py [--jobs 50] [--rounds 2] [--agent-apart] [--server-defaults]

A real `python worker.py` (so that its CPU time is its own) with a place for every job
(A40_MAX_JOBS = --jobs), the ComfyUI double rendering instantly in a process of its own, the
Temporal dev server. The baseline's workers run in this process, polling and running workflows
as the worker does (`worker.POLLING`, `worker.WORKFLOW_RUNNER`). With `--agent-apart` the GPU
host's agent (`spillway agent --host a40_local`) runs in a process of its own, so the worker's
CPU splits into its workflows (the job, the pool, the ledger) and the host's activities.

Prints, after ten unmeasured jobs of each kind:
1. the histories' counts for one job alone (nothing else running, so the pool's events in that
   window are that job's) and the mean over `--jobs` started back to back, for the job, for the
   pool (the events its runs gained during the batch, divided by the jobs; the pool continues as
   new every 500 signals, so every run of its chain is read), and for the baseline;
2. lone LOCAL jobs back to back and with 1 s idle before each: each one's history, its
   comfyui_wait and the time its steps waited to be matched, in ms (with `--server-defaults`, the
   server's transfer queue read 20 times a second shows in the first);
3. CPU ms per job of the worker process, the dev server, the doubles and this process (the
   client, plus the baseline's workers when the baseline runs), median of `--rounds` interleaved
   batches. CPU seconds do not depend on the machine's load the way wall-clock does; the jobs/s
   printed alongside do.

What a waiting job holds is measured by bench/line_memory.py (`--line 200 --trace --by-line`).
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
from collections import Counter
from collections.abc import Sequence
from datetime import datetime
from itertools import pairwise
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Worker

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.bare_workflow import JobShapedWorkflow, noop
from bench.common import (
    child_pid,
    cpu_s,
    run_main,
    start_dev_server,
    start_doubles,
    start_worker,
)
from spillway.client.jobs import submit
from spillway.core import names
from spillway.core.hosts import WAITS_SUFFIX
from spillway.core.models import VideoJob
from tests.support.graphs import VIDEO_GRAPH
from worker import POLLING, WORKFLOW_RUNNER

E = EventType
WARM = 10
ALONE = 5  # lone jobs of each kind, taking turns


def marker(e: HistoryEvent) -> str:
    """A marker's name, and a patch marker's patch id (which `workflow.patched` recorded it)."""
    attrs = e.marker_recorded_event_attributes
    for payloads in attrs.details.values():
        for payload in payloads.payloads:
            with contextlib.suppress(ValueError, AttributeError):
                return f"{attrs.marker_name} {json.loads(payload.data)['id']}"
    return attrs.marker_name


def timeline(events: Sequence[HistoryEvent], since: datetime, who: str) -> list[tuple[float, str]]:
    """The events that are a round trip's ends, as ms after `since` (the server's clock)."""
    rows = []
    scheduled: dict[int, str] = {}
    for e in events:
        kind = E.Name(e.event_type).removeprefix("EVENT_TYPE_").lower()
        if kind in ("workflow_task_scheduled", "activity_task_started", "timer_fired"):
            continue
        if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
            kind += " " + scheduled[e.event_id]
        elif e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            kind += " " + scheduled[e.activity_task_completed_event_attributes.scheduled_event_id]
        elif e.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            kind += " " + e.workflow_execution_signaled_event_attributes.signal_name
        at = (e.event_time.ToDatetime() - since).total_seconds() * 1000
        rows.append((at, f"{who} {kind}"))
    return rows


def tally(events: Sequence[HistoryEvent]) -> Counter[str]:
    """Events by type, and by name where the type carries one (an activity's type, a marker's,
    a signal's)."""
    c: Counter[str] = Counter(events=len(events))
    for e in events:
        c[E.Name(e.event_type).removeprefix("EVENT_TYPE_").lower()] += 1
        if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            c[f"  activity {e.activity_task_scheduled_event_attributes.activity_type.name}"] += 1
        elif e.event_type == E.EVENT_TYPE_MARKER_RECORDED:
            c[f"  marker {marker(e)}"] += 1
        elif e.event_type == E.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED:
            c[f"  signal in {e.workflow_execution_signaled_event_attributes.signal_name}"] += 1
        elif e.event_type == E.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED:
            attrs = e.signal_external_workflow_execution_initiated_event_attributes
            c[f"  signal out {attrs.signal_name}"] += 1
        elif e.event_type == E.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES:
            fields = e.upsert_workflow_search_attributes_event_attributes.search_attributes
            for key in fields.indexed_fields:
                c[f"  search attribute {key}"] += 1
        elif e.event_type == E.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED:
            memo = e.workflow_properties_modified_event_attributes.upserted_memo
            for key in memo.fields:
                c[f"  memo {key.split(':')[0]}"] += 1
    return c


async def job_tally(client: Client, handles: Sequence[WorkflowHandle[Any, Any]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for h in handles:
        total += tally((await client.get_workflow_handle(h.id).fetch_history()).events)
    return total


async def pool_events(client: Client, pool: str) -> dict[str, list[HistoryEvent]]:
    """Every run of the pool's chain, by run id: its events so far."""
    runs: dict[str, list[HistoryEvent]] = {}
    async for execution in client.list_workflows(f"WorkflowId = '{pool}'"):
        handle = client.get_workflow_handle(pool, run_id=execution.run_id)
        runs[execution.run_id] = list((await handle.fetch_history()).events)
    return runs


async def pool_runs(client: Client, pool: str) -> dict[str, Counter[str]]:
    return {run: tally(events) for run, events in (await pool_events(client, pool)).items()}


def gained(before: dict[str, Counter[str]], after: dict[str, Counter[str]]) -> Counter[str]:
    total: Counter[str] = Counter()
    for run, now in after.items():
        total += now - before.get(run, Counter())
    return total


async def until_visible(client: Client, pool: str, run_ids: set[str]) -> None:
    """Visibility lags the pool's continue-as-new: wait until the list holds the running run."""
    running = (await client.get_workflow_handle(pool).describe()).run_id
    for _ in range(50):
        if running in run_ids:
            return
        await asyncio.sleep(0.2)
        run_ids = set(await pool_runs(client, pool))


async def lone_job_ms(
    client: Client, handle: WorkflowHandle[Any, Any]
) -> tuple[float, float, float]:
    """From a job's history: its start to completion, its comfyui_wait's scheduled to completed,
    and the time its workflow tasks and activities waited to be matched (scheduled to started,
    summed), in ms."""
    events = (await client.get_workflow_handle(handle.id).fetch_history()).events
    at = {e.event_id: e.event_time.ToDatetime() for e in events}
    waits = {
        e.event_id
        for e in events
        if e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == names.COMFYUI_WAIT
    }
    wait_ms = matched_ms = 0.0
    scheduled_wft = at[events[0].event_id]
    for e in events:
        if e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled_wft = at[e.event_id]
        elif e.event_type == E.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            matched_ms += (at[e.event_id] - scheduled_wft).total_seconds() * 1000
        elif e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            sid = e.activity_task_started_event_attributes.scheduled_event_id
            matched_ms += (at[e.event_id] - at[sid]).total_seconds() * 1000
        elif e.event_type == E.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            sid = e.activity_task_completed_event_attributes.scheduled_event_id
            if sid in waits:
                wait_ms = (at[e.event_id] - at[sid]).total_seconds() * 1000
    total = events[-1].event_time.ToDatetime() - events[0].event_time.ToDatetime()
    return total.total_seconds() * 1000, wait_ms, matched_ms


def per(c: Counter[str], n: int) -> dict[str, float]:
    return {k: v / n for k, v in c.items()}


# The rows printed first, in this order; any other event type follows.
HEAD = [
    "events",
    "workflow_task_completed",
    "activity_task_scheduled",
    "marker_recorded",
    "timer_started",
    "workflow_execution_signaled",
    "signal_external_workflow_execution_initiated",
    "upsert_workflow_search_attributes",
    "workflow_properties_modified",
]


def print_table(columns: dict[str, dict[str, float]]) -> None:
    keys = {k for col in columns.values() for k in col}
    tops = [k for k in HEAD if k in keys]
    types = sorted(k for k in keys if not k.startswith(" ") and k not in HEAD)
    named = sorted(k for k in keys if k.startswith(" "))
    width = max(len(k) for k in keys) + 2
    print(" " * (width + 2) + "".join(f"{name:>14}" for name in columns))
    for key in [*tops, *types, *named]:
        cells = "".join(f"{col.get(key, 0):14.2f}" for col in columns.values())
        print(f"  {key:<{width}}{cells}")


async def main(jobs: int, rounds: int, agent_apart: bool, server_defaults: bool) -> None:
    sims, urls = await start_doubles(execution_s=0)
    env = await start_dev_server(server_defaults)
    client = env.client
    queue = f"overhead-{uuid.uuid4().hex[:8]}"
    pool = names.pool_id(queue)
    places = str(max(jobs, WARM))
    agent = None
    if agent_apart:  # a GPU host's set-up, and it splits the worker's CPU: workflows / activities
        worker = await start_worker(env, queue, urls, "worker", "--no-agents", A40_MAX_JOBS=places)
        agent = await start_worker(
            env, queue, urls, "agent", "--host", "a40_local", A40_MAX_JOBS=places
        )
    else:
        worker = await start_worker(env, queue, urls, A40_MAX_JOBS=places)
    host_queue = f"{queue}-shaped-gpu"
    like_the_worker: dict[str, Any] = {**POLLING, "workflow_runner": WORKFLOW_RUNNER}
    baseline = [
        Worker(
            client,
            task_queue=f"{queue}-shaped",
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
    processes = {
        "worker": worker.pid,
        "Temporal server": child_pid("temporal"),
        "doubles": sims.pid,
        "bench (client; shaped: + its workers)": os.getpid(),
    }
    if agent is not None:
        processes["agent (probe, fit, ComfyUI activities)"] = agent.pid

    async def start(kind: str) -> WorkflowHandle[Any, Any]:
        if kind == "LOCAL":
            job = VideoJob(job_id=f"ovh-{uuid.uuid4().hex[:12]}", graph=VIDEO_GRAPH)
            return await submit(client, job, queue)
        return await client.start_workflow(
            JobShapedWorkflow.run,
            host_queue,
            id=f"shaped-{uuid.uuid4()}",
            task_queue=f"{queue}-shaped",
        )

    async def batch(
        kind: str, n: int
    ) -> tuple[list[WorkflowHandle[Any, Any]], dict[str, float], float]:
        cpu0 = {k: cpu_s(p) for k, p in processes.items()}
        t0 = time.perf_counter()
        handles = [await start(kind) for _ in range(n)]
        results = await asyncio.gather(*(h.result() for h in handles))
        seconds = time.perf_counter() - t0
        cpu = {k: (cpu_s(p) - cpu0[k]) * 1000 / n for k, p in processes.items()}
        if kind == "LOCAL":
            assert all(r.state == "completed" and r.route == "local" for r in results), results
        return handles, cpu, n / seconds

    widest: list[tuple[float, list[tuple[float, str]]]] = []

    async def alone_s(kind: str) -> tuple[float, float]:
        """One job with nothing else running: start to result as the client sees it, and the
        server's start to completion from the history."""
        t0 = time.perf_counter()
        handle = await start(kind)
        await handle.result()
        seen = time.perf_counter() - t0
        events = (await client.get_workflow_handle(handle.id).fetch_history()).events
        server = events[-1].event_time.ToDatetime() - events[0].event_time.ToDatetime()
        if kind == "LOCAL":
            rows = timeline(events, events[0].event_time.ToDatetime(), "")
            gaps = sorted(
                ((b[0] - a[0], f"{a[1].strip()} -> {b[1].strip()}") for a, b in pairwise(rows)),
                reverse=True,
            )
            widest.append((server.total_seconds() * 1000, gaps[:3]))
        return seen, server.total_seconds()

    try:
        async with contextlib.AsyncExitStack() as stack:
            for w in baseline:
                await stack.enter_async_context(w)
            # The worker process takes a few seconds to import and poll; a job started before
            # that only waits, so the warm-up's first results wait for it.
            for kind in ("LOCAL", "shaped"):
                await batch(kind, WARM)
            await asyncio.sleep(2)  # the pool's work for the warm-up ends

            before = await pool_runs(client, pool)
            seen = {run: len(events) for run, events in (await pool_events(client, pool)).items()}
            (alone,), _, _ = await batch("LOCAL", 1)
            await asyncio.sleep(2)  # the pool's answer to the give-back lands in its history
            after = await pool_runs(client, pool)
            await until_visible(client, pool, set(after))
            after = await pool_runs(client, pool)
            one_job = await job_tally(client, [alone])
            job_events = (await client.get_workflow_handle(alone.id).fetch_history()).events
            since = job_events[0].event_time.ToDatetime()
            rows = timeline(job_events, since, "job ")
            for run, events in (await pool_events(client, pool)).items():
                rows += timeline(events[seen.get(run, 0) :], since, "pool")
            one_pool = gained(before, after)
            (shaped_one,), _, _ = await batch("shaped", 1)
            one_shaped = await job_tally(client, [shaped_one])
            lone: dict[str, list[tuple[float, float]]] = {"LOCAL": [], "shaped": []}
            for _ in range(ALONE):
                for kind in lone:
                    lone[kind].append(await alone_s(kind))
            # A job right behind another waited for the server's transfer queue at every step
            # (docs/performance.md, "The server's transfer queue"): both are printed, with the
            # wait's part and the time its steps waited to be matched.
            paced: dict[str, list[tuple[float, float, float]]] = {}
            for label, idle_s in (("back to back", 0.0), ("1 s idle before each", 1.0)):
                paced[label] = []
                for _ in range(ALONE):
                    await asyncio.sleep(idle_s)
                    handle = await start("LOCAL")
                    await handle.result()
                    paced[label].append(await lone_job_ms(client, handle))

            cpu: dict[str, list[dict[str, float]]] = {"LOCAL": [], "shaped": []}
            rate: dict[str, list[float]] = {"LOCAL": [], "shaped": []}
            local_handles: list[WorkflowHandle[Any, Any]] = []
            shaped_handles: list[WorkflowHandle[Any, Any]] = []
            pool_gain: Counter[str] = Counter()
            for _ in range(rounds):
                before = await pool_runs(client, pool)
                handles, c, r = await batch("LOCAL", jobs)
                await asyncio.sleep(2)
                await until_visible(client, pool, set(await pool_runs(client, pool)))
                pool_gain += gained(before, await pool_runs(client, pool))
                local_handles += handles
                cpu["LOCAL"].append(c)
                rate["LOCAL"].append(r)
                handles, c, r = await batch("shaped", jobs)
                shaped_handles += handles
                cpu["shaped"].append(c)
                rate["shaped"].append(r)
            many_job = await job_tally(client, local_handles)
            many_shaped = await job_tally(client, shaped_handles)
    finally:
        worker.kill()
        if agent is not None:
            agent.kill()
        sims.kill()

    n = len(local_handles)
    print("One LOCAL job alone: its events and the pool's, ms after the job's start (server clock)")
    for at, what in sorted(rows):
        print(f"  {at:8.1f}  {what}")
    print(f"History counts per job: one LOCAL job alone, and the mean of {n} ({rounds} batches")
    print(
        f"of {jobs} started back to back); the pool's events are those its runs gained meanwhile."
    )
    print_table(
        {
            "job, alone": per(one_job, 1),
            "pool, alone": per(one_pool, 1),
            f"job, {n}": per(many_job, n),
            f"pool, {n}": per(pool_gain, n),
            "shaped, alone": per(one_shaped, 1),
            f"shaped, {n}": per(many_shaped, n),
        }
    )

    def exchanges(c: dict[str, float]) -> float:
        """Tasks the server handed a worker and the worker answered: each a poll's answer and a
        completion, so at least one round trip each (signals sent from a workflow ride on a
        workflow task's completion; an activity's own signals are separate calls)."""
        return c.get("workflow_task_completed", 0) + c.get("activity_task_started", 0)

    local_x = exchanges(per(one_job, 1)) + exchanges(per(one_pool, 1))
    shaped_x = exchanges(per(one_shaped, 1))
    print(
        f"  tasks polled and answered, job + pool: LOCAL {local_x:.0f}, shaped {shaped_x:.0f} "
        f"({local_x / shaped_x:.2f}x)"
    )
    print(f"A lone job, median of {ALONE} of each kind taking turns (wall-clock, shared machine):")
    for kind, times in lone.items():
        client_ms = statistics.median(t[0] for t in times) * 1000
        server = statistics.median(t[1] for t in times) * 1000
        print(f"  {kind:<7} start -> result {client_ms:6.0f} ms, its history {server:6.0f} ms")
    print("  each lone LOCAL job: its history's ms, and its three widest gaps between events")
    for total, gaps in widest:
        listed = "; ".join(f"{ms:.0f} {between}" for ms, between in gaps)
        print(f"    {total:5.0f}  {listed}")
    for label, runs in paced.items():
        listed = ", ".join(f"{t:.0f} ({w:.0f}, {m:.0f})" for t, w, m in runs)
        print(
            f"  LOCAL alone, {label}: history ms (of it comfyui_wait, its steps waiting to be "
            f"matched): {listed}"
        )
    print(f"CPU ms per job, median of {rounds} batches of {jobs} (each batch's):")
    print(f"  {'':<40}{'LOCAL':>22}{'shaped':>22}")
    for name in processes:
        cells = ""
        for kind in ("LOCAL", "shaped"):
            values = [c[name] for c in cpu[kind]]
            listed = ",".join(f"{v:.1f}" for v in values)
            cells += f"{statistics.median(values):8.1f} ({listed:>11})"
        print(f"  {name:<40}{cells}")
    totals = {k: statistics.median(sum(c.values()) for c in cpu[k]) for k in cpu}
    print(f"  {'all processes':<40}{totals['LOCAL']:8.1f}{'':14}{totals['shaped']:8.1f}")
    local_rates = ", ".join(f"{r:.1f}" for r in rate["LOCAL"])
    shaped_rates = ", ".join(f"{r:.1f}" for r in rate["shaped"])
    print(f"jobs/s (shared machine, wall-clock): LOCAL {local_rates}; shaped {shaped_rates}")
    await env.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=(__doc__ or "").split("\n\n")[0],
        epilog="What a waiting job holds: bench/line_memory.py --line 200 --trace --by-line.",
    )
    parser.add_argument("--jobs", type=int, default=50, help="jobs per batch (50)")
    parser.add_argument("--rounds", type=int, default=2, help="interleaved batches of each (2)")
    parser.add_argument(
        "--agent-apart",
        action="store_true",
        help="the GPU host's agent in a process of its own: the worker's CPU split in two",
    )
    parser.add_argument(
        "--server-defaults",
        action="store_true",
        help="the dev server's own dynamic config (transfer queue read 20 times a second, not 100)",
    )
    args = parser.parse_args()
    run_main(main(args.jobs, args.rounds, args.agent_apart, args.server_defaults))
