"""The worker and its one GPU host's agent on the real dev server, on a task queue of its own:
the ComfyUI double as the host, the MiniMax double for the cloud (its key on the worker; armed
only when a test says CLOUD_VIDEO_FALLBACK_ENABLED)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from temporalio.client import Client

from spillway.core.settings import Settings
from spillway.core.tiers import load_tiers
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.settings import comfyui_values, make_settings, minimax_values
from worker import serving


@asynccontextmanager
async def one_host(
    client: Client,
    comfyui: ComfyUISim,
    minimax: MiniMaxSim,
    gpu: Any,
    folder: Path,
    **overrides: Any,
) -> AsyncIterator[Settings]:
    values = comfyui_values(comfyui, folder / "out") | minimax_values(minimax, folder / "o")
    settings = make_settings(values, SPILLWAY_TASK_QUEUE=f"one-{uuid.uuid4()}", **overrides)
    async with serving(client, settings, load_tiers(settings.SPILLWAY_ROUTING_TIERS), gpu=gpu):
        yield settings
