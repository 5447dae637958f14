"""Progress people can watch (docs/jobs.md, "The local route: ComfyUI"): how long a render's
progress takes from ComfyUI to `spillway status` and to the Temporal UI's current details, with the
host's places rendering and a long GPU line behind them. The Temporal dev server, the worker
and its agent in this process, the ComfyUI double rendering `--render-s` per prompt, its middle
third in `--steps` sampler steps.

    .venv/bin/python bench/progress.py [--line 500] [--render-s 20] [--steps 20]

The worker has two places (A40_MAX_JOBS=2); `--line` local jobs wait behind the two rendering.
Each rendering job's status (`spillway.client.jobs.status`, what `status --json` reads) and its
current details (the query the UI makes) are read every 0.1 s; for every progress message the
double sent, the time until each showed that step or a later one. Prints p50 / p95 / max, and how
many messages were measured.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import re
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.admission import start_jobs
from bench.common import run_main, start_dev_server
from spillway.client import jobs as job_ops
from spillway.core.models import VideoJob
from spillway.core.tiers import load_tiers
from spillway.sim.comfyui import ComfyUISim
from tests.support.a40 import FakeGpu
from tests.support.graphs import VIDEO_GRAPH
from tests.support.settings import comfyui_values, make_settings
from tests.support.waiting import until
from worker import serving

READ_EVERY_S = 0.1
UI_METADATA = "__temporal_workflow_metadata"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--line", type=int, default=500)
    parser.add_argument("--render-s", type=float, default=20.0)
    parser.add_argument("--steps", type=int, default=20)
    args = parser.parse_args()
    env = await start_dev_server()
    try:
        async with ComfyUISim() as sim:
            sim.execution_s, sim.progress_steps = args.render_s, args.steps
            sim.progress_nodes = {"CreateVideo"}  # one node's steps: each step's value once
            tmp = Path(tempfile.mkdtemp(prefix="spillway-progress-"))
            queue = f"progress-{uuid.uuid4()}"
            settings = make_settings(
                comfyui_values(sim, tmp / "out"), SPILLWAY_TASK_QUEUE=queue, A40_MAX_JOBS=2
            )
            tiers = load_tiers(settings.SPILLWAY_ROUTING_TIERS)
            async with serving(env.client, settings, tiers, gpu=FakeGpu()):
                rendering = [
                    VideoJob(job_id=f"render-{i}-{uuid.uuid4().hex[:6]}", graph=VIDEO_GRAPH)
                    for i in range(2)
                ]
                await start_jobs(env.client, queue, rendering)
                for job in rendering:  # the places are theirs before the line forms
                    await until(
                        functools.partial(job_ops.status, env.client, job.job_id),
                        lambda plan: plan.state == "running_local",
                        timeout_s=60,
                        what=f"{job.job_id} rendering",
                    )
                line = [
                    VideoJob(job_id=f"line-{i:04d}-{uuid.uuid4().hex[:6]}", graph=VIDEO_GRAPH)
                    for i in range(args.line)
                ]
                began = time.perf_counter()
                await start_jobs(env.client, queue, line)
                print(
                    f"{args.line} jobs in line behind 2 renders of {args.render_s:g} s "
                    f"({args.steps} steps), submitted in {time.perf_counter() - began:.1f} s"
                )
                seen = await asyncio.gather(*(watch(env.client, j.job_id) for j in rendering))
        for what, index in (("status shows it", 0), ("the UI's details", 1)):
            lags = []
            for prompt_id, *shows in seen:
                steps_seen = shows[index]
                for sent_prompt, step, sent_at in sim.progress_sent:
                    if sent_prompt != prompt_id:
                        continue
                    shown = [at for value, at in steps_seen if value >= step and at >= sent_at]
                    if shown:
                        lags.append(min(shown) - sent_at)
            cuts = statistics.quantiles(lags, n=100, method="inclusive")
            print(
                f"  progress message -> {what:16} p50 {cuts[49]:5.2f} s   p95 {cuts[94]:5.2f} s"
                f"   max {max(lags):5.2f} s  ({len(lags)} messages)"
            )
    finally:
        await env.shutdown()


Seen = list[tuple[int, float]]


async def watch(client: Client, job_id: str) -> tuple[str, Seen, Seen]:
    """The job's prompt id, and each step its status and its current details showed, with when,
    until it completed. Two readers of their own: a slow read of one does not delay the other."""
    in_status: Seen = []
    in_details: Seen = []
    handle = client.get_workflow_handle(job_id)
    ended = asyncio.Event()

    async def details() -> None:
        while not ended.is_set():
            metadata = await handle.query(UI_METADATA, result_type=WorkflowMetadata)
            step = re.search(r"Progress: .* (\d+)/\d+", metadata.current_details)
            if step is not None:
                in_details.append((int(step.group(1)), time.time()))
            await asyncio.sleep(READ_EVERY_S)

    reading = asyncio.create_task(details())
    while True:
        plan = await job_ops.status(client, job_id)
        if plan.state == "completed":
            assert plan.prompt_id is not None
            ended.set()
            await reading
            return plan.prompt_id, in_status, in_details
        if plan.progress is not None and plan.progress.value is not None:
            in_status.append((plan.progress.value, time.time()))
        await asyncio.sleep(READ_EVERY_S)


if __name__ == "__main__":
    run_main(main())
