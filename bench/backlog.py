"""A backlog that must not starve a decision (docs/design.md, "GPU hosts and agents"): N local
jobs wait on a slow ComfyUI, then M armed jobs arrive for a GPU that is now busy.

    .venv/bin/python bench/backlog.py [--waiting 1000] [--new 50] [--agent-apart]

Prints, for the new jobs, the time from their start to their decision (the `spend_reserve` the
cloud route schedules first: policy read, every host probed, decided), p50 and p99; and the
worker process's RSS and open sockets while the backlog waits. The worker is a real
`python worker.py` with the agent in process, or with `--agent-apart` `spillway worker
--no-agents` next to `spillway agent --host a40_local` (a GPU host's set-up); the doubles run in
their own process, the server is the Temporal dev server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import httpx
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import rss_mb, run_main, start_dev_server, start_doubles, start_worker
from spillway.client.jobs import submit
from spillway.core import names
from spillway.core import search_attributes as sa
from spillway.core.models import CloudRequest, VideoJob
from tests.support.graphs import VIDEO_GRAPH


def sockets(pid: int) -> int:
    fds = Path(f"/proc/{pid}/fd")
    return sum(1 for fd in fds.iterdir() if os.readlink(fd).startswith("socket:"))


async def count(client: Client, queue: str, state: str) -> int:
    query = f"TaskQueue = '{queue}' AND {sa.STATE.name} = '{state}'"
    return (await client.count_workflows(query)).count


async def decision_s(client: Client, job_id: str) -> float:
    """From the job's start to the first `spend_reserve` it schedules (its decision)."""
    history = await client.get_workflow_handle(job_id).fetch_history()
    started = history.events[0].event_time.ToDatetime()
    for event in history.events:
        attributes = event.activity_task_scheduled_event_attributes
        if (
            event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and attributes.activity_type.name == names.SPEND_RESERVE
        ):
            return (event.event_time.ToDatetime() - started).total_seconds()
    raise SystemExit(f"{job_id} never decided")


async def print_steps(client: Client, job_id: str) -> None:
    """What one job did from its start to its decision, with the time of each event."""
    history = await client.get_workflow_handle(job_id).fetch_history()
    started = history.events[0].event_time.ToDatetime()
    print(f"  steps of {job_id} up to its decision:")
    for event in history.events:
        at = (event.event_time.ToDatetime() - started).total_seconds()
        name = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
        attributes = event.activity_task_scheduled_event_attributes
        activity = attributes.activity_type.name if name == "ACTIVITY_TASK_SCHEDULED" else ""
        print(f"    {at:6.2f} s  {name} {activity}")
        if activity == names.SPEND_RESERVE:
            return


async def main(waiting: int, new: int, pause_s: float, agent_apart: bool) -> None:
    sims, urls = await start_doubles(execution_s=3600)
    env = await start_dev_server()
    queue = f"bench-{uuid.uuid4()}"
    # A place for every backlog job: they wait on ComfyUI itself, which is what this measures
    # (bench/admission.py measures a line in spillway's GPU pool).
    armed = {
        "CLOUD_VIDEO_FALLBACK_ENABLED": "1",
        "MINIMAX_POLL_INTERVAL_S": "2",
        "A40_MAX_JOBS": str(max(waiting, 1)),
    }
    agent = None
    if agent_apart:  # the GPU host's set-up: the agent in a process of its own
        worker = await start_worker(env, queue, urls, "worker", "--no-agents", **armed)
        agent = await start_worker(env, queue, urls, "agent", "--host", "a40_local", **armed)
    else:
        worker = await start_worker(env, queue, urls, **armed)
    await asyncio.sleep(3)
    idle_rss, idle_sockets = rss_mb(worker.pid), sockets(worker.pid)

    # The backlog: local jobs (no cloud prompt) that ComfyUI queues and renders for an hour.
    for n in range(waiting):
        job = VideoJob(job_id=f"backlog-{n:04d}-{uuid.uuid4().hex[:6]}", graph=VIDEO_GRAPH)
        await submit(env.client, job, queue)
    started = time.perf_counter()
    while await count(env.client, queue, "running_local") < waiting:
        if time.perf_counter() - started > 900:
            raise SystemExit("the backlog never formed")
        await asyncio.sleep(1)
    await asyncio.sleep(10)  # every wait is under way
    backlog_rss, backlog_sockets = rss_mb(worker.pid), sockets(worker.pid)
    if agent is not None:
        agent_rss, agent_sockets = rss_mb(agent.pid), sockets(agent.pid)
        print(f"  agent during the backlog: RSS {agent_rss:.1f} MB, {agent_sockets} sockets")
    if pause_s:  # time to attach a profiler: py-spy record --pid <pid>
        print(f"backlog formed; worker pid {worker.pid}; new jobs in {pause_s:g} s", flush=True)
        await asyncio.sleep(pause_s)

    # The GPU is busy now: armed jobs must reach the cloud without waiting behind the backlog.
    async with httpx.AsyncClient() as http:
        await http.post(f"{urls['comfyui']}/sim/gpu", json={"vram_used_pct": 97})
    cloud = CloudRequest(prompt="a lighthouse at dusk")
    ids = [f"new-{n:03d}-{uuid.uuid4().hex[:6]}" for n in range(new)]
    await asyncio.gather(
        *(
            submit(env.client, VideoJob(job_id=i, graph=VIDEO_GRAPH, cloud=cloud), queue)
            for i in ids
        )
    )
    started = time.perf_counter()
    while (
        await count(env.client, queue, "running_cloud")
        + await count(env.client, queue, "completed")
        < new
    ):
        if time.perf_counter() - started > 600:
            raise SystemExit("the new jobs never reached the cloud")
        await asyncio.sleep(0.5)
    decisions = sorted([await decision_s(env.client, i) for i in ids])
    if os.environ.get("BENCH_DETAIL"):
        await print_steps(env.client, ids[-1])
    q = statistics.quantiles(decisions, n=100, method="inclusive")
    print(f"{waiting} local jobs waiting on ComfyUI, then {new} armed jobs for a busy GPU")
    where = "its own process" if agent_apart else "the worker's process"
    print(f"  one worker, the agent in {where}, {os.cpu_count()} cores, dev server")
    print(f"  decision of the new jobs     p50 {q[49]:6.2f} s   p99 {q[98]:6.2f} s")
    print(f"  worker RSS                   idle {idle_rss:6.1f} MB   backlog {backlog_rss:6.1f} MB")
    print(
        f"  worker open sockets          idle {idle_sockets:6d}      backlog {backlog_sockets:6d}"
    )
    processes = [p for p in (worker, agent, sims) if p is not None]
    for process in processes:
        process.terminate()
    await asyncio.gather(*(p.wait() for p in processes))
    await env.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--waiting", type=int, default=1000)
    parser.add_argument("--new", type=int, default=50)
    parser.add_argument(
        "--pause", type=float, default=0, help="seconds between the backlog and the new jobs"
    )
    parser.add_argument(
        "--agent-apart",
        action="store_true",
        help="run the GPU host's agent as `spillway agent` in a process of its own",
    )
    args = parser.parse_args()
    run_main(main(args.waiting, args.new, args.pause, args.agent_apart))
