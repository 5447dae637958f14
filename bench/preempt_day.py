"""Preemption on a studio day (docs/design.md, "Preemption"): batch work at priority 5 with an
urgent job at priority 1 in every ten, with a real `python worker.py` (its agent in process), the
doubles in a process of their own and the Temporal dev server.

    .venv/bin/python bench/preempt_day.py [--jobs 40] [--every-s 2] [--renders 4,8,16] \
        [--places 2]

Two places (A40_MAX_JOBS=2; one ComfyUI renders one prompt at a time, so the second place holds
the next prompt pending, and a victim admitted last is usually that one: deleted, nothing
lost; with `--places 1` every victim is the render running). A job arrives every `--every-s`
seconds, every tenth one urgent; renders take the lengths of `--renders` in turn (on the ComfyUI
double, whose interrupt acts at the next node boundary: a third of a render here). Prints, with
SPILLWAY_PREEMPT=priority beside SPILLWAY_PREEMPT=off, in one run (each on a task queue and a
worker of its own, one after the other, on the same dev server and doubles): the urgent jobs'
admission wait (their ask to the pool's answer giving them a place, from the pool's history) p50
and p95, and the batch render seconds lost per urgent job (each interrupted render's start to its
interruption, from ComfyUI's own history).
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.backlog import count
from bench.common import run_main, start_dev_server, start_doubles, start_worker
from bench.teams import admission_waits
from spillway.client.jobs import status, submit
from spillway.core.models import VideoJob
from tests.support.graphs import VIDEO_GRAPH


def graph(render_s: float) -> dict[str, Any]:
    g = copy.deepcopy(VIDEO_GRAPH)
    first = next(iter(g.values()))
    first["inputs"]["sim_render_s"] = render_s
    return g


def day(args: argparse.Namespace) -> list[VideoJob]:
    renders = [float(r) for r in args.renders.split(",")]
    return [
        VideoJob(
            job_id=f"{'urgent' if n % 10 == 9 else 'batch'}-{n:03d}-{uuid.uuid4().hex[:6]}",
            graph=graph(renders[n % len(renders)]),
            priority=1 if n % 10 == 9 else 5,
        )
        for n in range(args.jobs)
    ]


async def lost_render_s(comfyui: str, prompts: set[str]) -> tuple[float, int]:
    """Seconds the interrupted prompts of this arm had rendered, by ComfyUI's own clock, and
    how many were interrupted."""
    async with httpx.AsyncClient() as http:
        history: dict[str, Any] = (await http.get(f"{comfyui}/history", timeout=30)).json()
    lost, interrupted = 0.0, 0
    for prompt_id, entry in history.items():
        if not any(prompt_id.startswith(f"spillway-{job}-") for job in prompts):
            continue
        times = {kind: data.get("timestamp") for kind, data in entry["status"]["messages"]}
        if "execution_interrupted" in times and times.get("execution_start"):
            lost += (times["execution_interrupted"] - times["execution_start"]) / 1000
            interrupted += 1
    return lost, interrupted


async def one_arm(
    env: Any, urls: dict[str, str], args: argparse.Namespace, preempt: str
) -> tuple[list[float], float, int, int]:
    queue = f"preempt-{uuid.uuid4()}"
    worker = await start_worker(
        env,
        queue,
        urls,
        A40_MAX_JOBS=str(args.places),
        SPILLWAY_PREEMPT=preempt,
        SPILLWAY_POOL_AGING_S="0",
    )
    jobs = day(args)
    try:
        await asyncio.sleep(3)
        for job in jobs:
            await submit(env.client, job, queue)
            await asyncio.sleep(args.every_s)
        started = time.perf_counter()
        longest = max(float(r) for r in args.renders.split(","))
        while await count(env.client, queue, "completed") < len(jobs):
            if time.perf_counter() - started > 120 + 2 * longest * len(jobs):
                raise SystemExit("the jobs never all completed")
            await asyncio.sleep(1)
        waits = await admission_waits(env.client, queue)
        lost, interrupted = await lost_render_s(urls["comfyui"], {j.job_id for j in jobs})
        plans = [await status(env.client, j.job_id) for j in jobs]
        preempted = sum(p.preempted is not None for p in plans)
    finally:
        worker.kill()
    urgent = [waits[j.job_id] for j in jobs if j.priority == 1]
    return urgent, lost, interrupted, preempted


def p50_p95(values: list[float]) -> tuple[float, float]:
    cuts = statistics.quantiles(values, n=100, method="inclusive")
    return cuts[49], cuts[94]


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=40, help="jobs in the day (every tenth urgent)")
    parser.add_argument("--every-s", type=float, default=2.0, help="seconds between arrivals")
    parser.add_argument("--renders", default="4,8,16", help="render lengths in turn, seconds")
    parser.add_argument("--places", type=int, default=2, help="A40_MAX_JOBS")
    args = parser.parse_args()
    env = await start_dev_server()
    sims, urls = await start_doubles(execution_s=4.0)
    try:
        off = await one_arm(env, urls, args, "off")
        on = await one_arm(env, urls, args, "priority")
    finally:
        sims.kill()
        await env.shutdown()
    print(
        f"{args.jobs} jobs, one every {args.every_s:g} s, every tenth urgent (priority 1, the "
        f"rest 5); renders of {args.renders} s in turn; A40_MAX_JOBS={args.places}"
    )
    for name, (urgent, lost, interrupted, preempted) in (
        ("SPILLWAY_PREEMPT=off", off),
        ("=priority", on),
    ):
        p50, p95 = p50_p95(urgent)
        print(
            f"  {name:20}  urgent admission wait p50 {p50:5.1f} s  p95 {p95:5.1f} s   "
            f"batch render lost per urgent job {lost / len(urgent):5.1f} s  "
            f"({preempted} preempted, {interrupted} of them mid-render)"
        )


if __name__ == "__main__":
    run_main(main())
