"""A worker holding many jobs that wait for approval: its resident memory, and the time to
approve them all and see them finish in the (simulated) cloud.

    .venv/bin/python bench/throughput.py [--jobs 1000]

The worker is a real `python worker.py` process (its RSS is read from /proc), the doubles run in
their own process (`python -m spillway.sim`), the server is the Temporal dev server.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
import uuid
from pathlib import Path

import httpx
from temporalio.testing import WorkflowEnvironment

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import rss_mb, run_main, start_dev_server, start_doubles, start_worker
from spillway.client.jobs import submit
from spillway.core import search_attributes as sa
from spillway.core.models import ApprovalDecision, CloudRequest, VideoJob
from spillway.core.names import DECIDE_UPDATE
from tests.support.graphs import VIDEO_GRAPH


async def count(env: WorkflowEnvironment, state: str) -> int:
    query = f"WorkflowType = 'VideoJobWorkflow' AND {sa.STATE.name} = '{state}'"
    return (await env.client.count_workflows(query)).count


async def until(env: WorkflowEnvironment, state: str, n: int, timeout_s: float) -> float:
    started = time.perf_counter()
    while await count(env, state) < n:
        if time.perf_counter() - started > timeout_s:
            raise SystemExit(f"only {await count(env, state)} of {n} jobs reached {state}")
        await asyncio.sleep(0.5)
    return time.perf_counter() - started


async def main(jobs: int) -> None:
    sims, urls = await start_doubles(execution_s=0)
    async with httpx.AsyncClient() as http:  # the A40 is busy for the whole run
        await http.post(f"{urls['comfyui']}/sim/gpu", json={"vram_used_pct": 95})
    env = await start_dev_server()
    queue = f"bench-{uuid.uuid4()}"
    worker = await start_worker(
        env, queue, urls, MINIMAX_POLL_INTERVAL_S="0.5", APPROVAL_TIMEOUT_S="3600"
    )
    await asyncio.sleep(3)
    idle_rss = rss_mb(worker.pid)

    started = time.perf_counter()
    ids = [f"wait-{i:04d}-{uuid.uuid4().hex[:6]}" for i in range(jobs)]
    cloud = CloudRequest(prompt="a lighthouse at dusk")
    for job_id in ids:
        await submit(env.client, VideoJob(job_id=job_id, graph=VIDEO_GRAPH, cloud=cloud), queue)
    await until(env, "awaiting_approval", jobs, timeout_s=600)
    waiting_s = time.perf_counter() - started
    await asyncio.sleep(5)  # let the worker settle
    waiting_rss = rss_mb(worker.pid)

    decision = ApprovalDecision(approved=True, by="bench", reason="throughput")
    started = time.perf_counter()
    await asyncio.gather(
        *(
            env.client.get_workflow_handle(job_id).execute_update(
                DECIDE_UPDATE, decision, result_type=str
            )
            for job_id in ids
        )
    )
    accepted_s = time.perf_counter() - started
    await until(env, "completed", jobs, timeout_s=900)
    completed_s = time.perf_counter() - started
    peak_rss = rss_mb(worker.pid, "VmHWM")

    print(f"{jobs} jobs waiting for approval on one worker process ({os.cpu_count()} cores)")
    print(f"  submitted and all waiting after     {waiting_s:7.1f} s")
    print(f"  worker RSS idle                     {idle_rss:7.1f} MB")
    print(f"  worker RSS, all jobs waiting        {waiting_rss:7.1f} MB")
    print(f"  per waiting job                     {(waiting_rss - idle_rss) / jobs * 1024:7.1f} KB")
    print(f"  approve all (updates accepted)      {accepted_s:7.1f} s")
    print(f"  approve all -> all done (cloud)     {completed_s:7.1f} s")
    print(f"  worker peak RSS                     {peak_rss:7.1f} MB")
    worker.terminate()
    sims.terminate()
    await asyncio.gather(worker.wait(), sims.wait())
    await env.shutdown()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--jobs", type=int, default=1000)
    run_main(main(parser.parse_args().jobs))
