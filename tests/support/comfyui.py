"""The LOCAL route's double and inputs; loaded by conftest.

- `comfyui`: the ComfyUI double on loopback, an A40 with the seed's free-GPU reading
  (FREE_VRAM_PCT of its VRAM used, an empty queue); tests set its timing (`execution_s`, ...).
- `comfyui_activities(**overrides)`: ComfyUIActivities on `comfyui_settings`, heartbeating often.
- `submit_request(job_id, graph)`, `wait_request(submit)`: the activities' inputs for a graph
  (tests/support/graphs.py).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from activities.comfyui import ComfyUIActivities
from spillway.comfyui_models import ComfyUISubmit, ComfyUIWait, client_id_for, prompt_id_for
from spillway.sim.comfyui import ComfyUISim
from tests.support.constants import FREE_VRAM_PCT
from tests.support.settings import SettingsFactory


def submit_request(job_id: str, graph: dict[str, Any], attempt: int = 1) -> ComfyUISubmit:
    return ComfyUISubmit(
        job_id=job_id,
        prompt_id=prompt_id_for(job_id, attempt),
        client_id=client_id_for(job_id),
        graph=graph,
    )


def wait_request(submit: ComfyUISubmit) -> ComfyUIWait:
    return ComfyUIWait(job_id=submit.job_id, prompt_id=submit.prompt_id, client_id=submit.client_id)


@pytest.fixture
async def comfyui() -> AsyncIterator[ComfyUISim]:
    async with ComfyUISim() as sim:
        sim.set_vram_used_pct(FREE_VRAM_PCT)
        yield sim


@pytest.fixture
def comfyui_activities(
    http: httpx.AsyncClient, comfyui_settings: SettingsFactory
) -> Callable[..., ComfyUIActivities]:
    def make(**overrides: Any) -> ComfyUIActivities:
        return ComfyUIActivities(http, comfyui_settings(**overrides), heartbeat_every_s=0.05)

    return make
