"""Warm models (docs/design.md, "Hosts that differ"): two GPU hosts of one place each, `--jobs`
local jobs whose graphs load one of two checkpoints in turn, submitted one after the other, on
ComfyUI doubles that charge `--load-s` whenever a host switches model files (renders take
`--render-s`). Run twice on the Temporal dev server, the worker and both agents in this process:
with the pool preferring warm models (SPILLWAY_POOL_PREFER_WARM=true, the default) and without.

    .venv/bin/python bench/warm_models.py [--jobs 40] [--load-s 5] [--render-s 1]

Prints per run: the model switches both hosts made, the time from the first submit to the last
job completed, and each job's wait from its submit to its render's start (p50, max).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import run_main, start_dev_server
from spillway.client.jobs import submit
from spillway.core.models import VideoJob
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.comfyui_graph import Host
from tests.support.a40 import FakeGpu
from tests.support.graphs import VIDEO_GRAPH
from tests.support.two_hosts import two_hosts

MODELS = ("wan2.2_t2v_14B.safetensors", "wan2.2_ti2v_5B.safetensors")


def graph(model: str) -> dict[str, Any]:
    """VIDEO_GRAPH whose output also depends on a checkpoint loader (the double follows links
    without checking their types)."""
    save = VIDEO_GRAPH["3"]
    return VIDEO_GRAPH | {
        "4": {"class_type": "CheckpointLoaderSimple", "inputs": {"ckpt_name": model}},
        "3": save | {"inputs": save["inputs"] | {"model": ["4", 0]}},
    }


async def starts(sim: ComfyUISim) -> dict[str, float]:
    """Each prompt's execution_start on the double, in seconds since the epoch."""
    async with httpx.AsyncClient() as http:
        history = (await http.get(f"{sim.url}/history")).json()
    return {
        prompt: {k: d["timestamp"] for k, d in item["status"]["messages"]}["execution_start"] / 1e3
        for prompt, item in history.items()
    }


async def one_run(env: Any, args: argparse.Namespace, prefer_warm: bool) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="spillway-warm-"))
    async with two_hosts(
        env.client, FakeGpu(), tmp, SPILLWAY_POOL_PREFER_WARM=prefer_warm
    ) as hosts:
        a, b = hosts.a, hosts.b
        for sim in (a, b):
            sim.execution_s, sim.model_load_s = args.render_s, args.load_s
            sim.installed = Host(models={"checkpoints": MODELS})
        submitted: dict[str, float] = {}
        handles = []
        began = time.perf_counter()
        for i in range(args.jobs):
            job = VideoJob(
                job_id=f"warm-{i:03d}-{uuid.uuid4().hex[:6]}", graph=graph(MODELS[i % 2])
            )
            submitted[job.job_id] = time.time()
            handles.append(await submit(env.client, job, hosts.queue))
        plans = await asyncio.gather(*(h.result() for h in handles))
        took = time.perf_counter() - began
        started = await starts(a) | await starts(b)
    waits = [started[p.prompt_id] - submitted[p.job_id] for p in plans if p.prompt_id]
    switches = a.model_loads + b.model_loads
    label = "preferring warm models" if prefer_warm else "not preferring them   "
    print(
        f"  {label}  switches {switches:3d}   total {took:6.1f} s   "
        f"wait p50 {statistics.median(waits):6.1f} s  max {max(waits):6.1f} s"
    )


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=40)
    parser.add_argument("--load-s", type=float, default=5.0)
    parser.add_argument("--render-s", type=float, default=1.0)
    args = parser.parse_args()
    print(
        f"{args.jobs} jobs, two checkpoints in turn, two hosts of one place each, "
        f"renders {args.render_s:g} s, a model switch {args.load_s:g} s"
    )
    env = await start_dev_server()
    try:
        for prefer_warm in (True, False):
            await one_run(env, args, prefer_warm)
    finally:
        await env.shutdown()


if __name__ == "__main__":
    run_main(main())
