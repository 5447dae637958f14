"""The worker process itself: Prometheus metrics (the SDK's and spillway's own), a clean stop
on SIGTERM, and its imports."""

from __future__ import annotations

import ast
import asyncio
from pathlib import Path

import httpx

import worker
from spillway.core.models import Plan
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.cli import free_ports
from tests.support.constants import BUSY_VRAM_PCT, CLIP_USD
from tests.support.jobs import Jobs
from tests.support.teams import start, write_teams
from tests.support.worker_process import FAST_CLOUD


async def test_the_worker_serves_job_probe_and_sdk_metrics_then_stops_on_sigterm(
    worker_process, dev_env, comfyui: ComfyUISim
):
    comfyui.execution_s = 0.1
    [port] = free_ports(1)
    worker = await worker_process(COMFYUI_URL=comfyui.url, SPILLWAY_METRICS_PORT=port)
    handle = await Jobs(dev_env.client, worker.task_queue).start(prompt=None)
    plan: Plan = await asyncio.wait_for(handle.result(), 60)
    assert plan.state == "completed"

    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"http://127.0.0.1:{port}/metrics", timeout=5)).text
    routed = [line for line in metrics.splitlines() if line.startswith("spillway_jobs_routed")]
    assert any('route="local"' in line and 'authorised="none"' in line for line in routed)
    assert "spillway_load_probe_seconds_count" in metrics
    assert "spillway_jobs_awaiting_approval" in metrics
    assert "temporal_workflow_completed" in metrics  # the SDK's own
    gpu = [line for line in metrics.splitlines() if line.startswith("spillway_gpu_")]
    assert any(line.startswith("spillway_gpu_admission_wait_bucket") for line in gpu), gpu
    assert any(line.startswith("spillway_gpu_places_in_use{") for line in gpu), gpu
    assert any(line.startswith("spillway_gpu_line_length") for line in gpu), gpu

    await worker.stop()  # SIGTERM
    assert "shutting down: waits hand over now, a create in flight gets" in worker.log
    assert "Traceback" not in worker.log


async def test_the_worker_publishes_the_day_s_cloud_spend_for_the_studio_and_each_team(
    worker_process, dev_env, comfyui: ComfyUISim, minimax: MiniMaxSim, tmp_path: Path
):
    comfyui.set_vram_used_pct(BUSY_VRAM_PCT)
    [port] = free_ports(1)
    worker = await worker_process(
        COMFYUI_URL=comfyui.url,
        MINIMAX_BASE_URL=minimax.url,
        **FAST_CLOUD,
        CLOUD_VIDEO_FALLBACK_ENABLED=1,
        SPILLWAY_TEAMS_FILE=str(write_teams(tmp_path)),
        SPILLWAY_METRICS_PORT=port,
    )
    jobs = Jobs(dev_env.client, worker.task_queue)
    job_id = await start(jobs, "ads", "an ads clip")
    handle = jobs.client.get_workflow_handle(job_id, result_type=Plan)
    plan = await asyncio.wait_for(handle.result(), 60)
    assert plan.route == "cloud"

    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"http://127.0.0.1:{port}/metrics", timeout=5)).text
    spend = {
        line.split("{", 1)[1].split("}", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in metrics.splitlines()
        if line.startswith("spillway_cloud_spend_today_usd{")
    }
    assert [v for k, v in spend.items() if 'team="all"' in k] == [CLIP_USD], spend
    assert [v for k, v in spend.items() if 'team="ads"' in k] == [CLIP_USD], spend


async def test_the_worker_counts_preemptions(worker_process, dev_env, comfyui: ComfyUISim):
    comfyui.execution_s = 0.2
    comfyui.stall_next = 1  # the batch job's render runs until it is interrupted, however slow
    [port] = free_ports(1)
    worker = await worker_process(
        COMFYUI_URL=comfyui.url,
        A40_MAX_JOBS=1,
        SPILLWAY_PREEMPT="priority",
        SPILLWAY_METRICS_PORT=port,
    )
    jobs = Jobs(dev_env.client, worker.task_queue)
    batch = await jobs.start(prompt=None, priority=5)
    await jobs.until(batch, "running_local")
    urgent = await jobs.start(prompt=None, priority=1)
    plans = await asyncio.wait_for(asyncio.gather(batch.result(), urgent.result()), 60)
    assert plans[0].preempted is not None

    async with httpx.AsyncClient() as http:
        metrics = (await http.get(f"http://127.0.0.1:{port}/metrics", timeout=5)).text
    counted = [m for m in metrics.splitlines() if m.startswith("spillway_gpu_preemptions")]
    assert any('host="a40_local"' in m and m.endswith(" 1") for m in counted), counted


def test_the_worker_takes_nothing_from_the_cli():
    """`spillway worker` imports worker.py: the worker importing the CLI back would make a
    circle, where which module finishes first depends on who was imported first."""
    tree = ast.parse(Path(worker.__file__).read_text(encoding="utf-8"))
    imported = {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    imported |= {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    assert not {m for m in imported if m and m.split(".")[:2] == ["spillway", "cli"]}
