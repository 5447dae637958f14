"""Two GPU hosts on the real dev server: two ComfyUI doubles (`gpu-a`, `gpu-b`), the worker and
both agents in this process, on a task queue of their own. The doubles render 0.3 s until told
otherwise; set what a test needs on them before it submits (what a host has installed is read
at the first job's fit)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from temporalio.client import Client

from spillway.core.tiers import load_tiers
from spillway.sim.comfyui import ComfyUISim
from tests.support.settings import comfyui_values, make_settings, two_host_tiers
from worker import serving


@dataclass
class TwoHosts:
    client: Client
    queue: str
    a: ComfyUISim
    b: ComfyUISim


@asynccontextmanager
async def two_hosts(
    client: Client, gpu: Any, folder: Path, places: tuple[int, int] = (1, 1), **overrides: Any
) -> AsyncIterator[TwoHosts]:
    async with ComfyUISim() as a, ComfyUISim() as b:
        a.execution_s = b.execution_s = 0.3
        tiers = two_host_tiers(
            folder,
            {"name": "gpu-a", "comfyui_url": a.url, "max_jobs": places[0]},
            {"comfyui_url": b.url, "max_jobs": places[1]},
        )
        values = comfyui_values(a, folder / "out") | {"SPILLWAY_ROUTING_TIERS": tiers}
        queue = f"two-{uuid.uuid4()}"
        settings = make_settings(values, SPILLWAY_TASK_QUEUE=queue, **overrides)
        async with serving(client, settings, load_tiers(tiers), gpu=gpu):
            yield TwoHosts(client, queue, a, b)
