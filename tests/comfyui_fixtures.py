"""Fixtures of the LOCAL route (ComfyUI activities and double); loaded by conftest.

- `comfyui` (conftest): the ComfyUI double; tests here set its timing (`execution_s`, ...).
- `comfyui_settings(**overrides)`: Settings pointing at it, with a short history poll and a
  per-test output folder.
- `comfyui_activities(**overrides)`: ComfyUIActivities on those settings, heartbeating often.
- `run_comfyui_activity(fn, arg)`: runs one activity in an ActivityEnvironment and returns
  `(result or exception, heartbeat details)`.
- Graphs as ComfyUI's "Export (API)" writes them: `VIDEO_GRAPH` (EmptyImage -> CreateVideo ->
  SaveVideo, an mp4 under "images" with "animated"), `ANIMATION_GRAPH` (SaveAnimatedWEBP),
  `SLOW_GRAPH` (a blur chain: several node boundaries to interrupt at).
"""

from __future__ import annotations

import copy
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.testing import ActivityEnvironment

from activities.comfyui import ComfyUIActivities
from spillway.comfyui_models import ComfyUISubmit, ComfyUIWait, client_id_for, prompt_id_for
from spillway.settings import Settings
from spillway.sim.comfyui import ComfyUISim

POLL_S = 0.1  # production polls every few seconds; the same logic runs here in milliseconds

VIDEO_GRAPH: dict[str, Any] = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 64, "height": 64, "batch_size": 4, "color": 7},
    },
    "2": {"class_type": "CreateVideo", "inputs": {"images": ["1", 0], "fps": 8.0}},
    "3": {
        "class_type": "SaveVideo",
        "inputs": {
            "video": ["2", 0],
            "filename_prefix": "video/job",
            "format": "mp4",
            "codec": "h264",
        },
    },
}

ANIMATION_GRAPH: dict[str, Any] = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 64, "height": 64, "batch_size": 8, "color": 7586251},
    },
    "2": {
        "class_type": "SaveAnimatedWEBP",
        "inputs": {
            "images": ["1", 0],
            "filename_prefix": "anim/orch",
            "fps": 8.0,
            "lossless": False,
            "quality": 80,
            "method": "default",
        },
    },
}

SLOW_GRAPH: dict[str, Any] = {
    "1": {
        "class_type": "EmptyImage",
        "inputs": {"width": 768, "height": 768, "batch_size": 32, "color": 3442609},
    },
    **{
        str(n): {
            "class_type": "ImageBlur",
            "inputs": {
                "image": [str(n - 1) if n > 10 else "1", 0],
                "blur_radius": 31,
                "sigma": 10.0,
            },
        }
        for n in (10, 11, 12)
    },
    "2": {
        "class_type": "SaveAnimatedWEBP",
        "inputs": {
            "images": ["12", 0],
            "filename_prefix": "slow/s",
            "fps": 8.0,
            "lossless": False,
            "quality": 50,
            "method": "fastest",
        },
    },
}


def graph_without(graph: dict[str, Any], node_id: str, input_name: str) -> dict[str, Any]:
    broken = copy.deepcopy(graph)
    del broken[node_id]["inputs"][input_name]
    return broken


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
def comfyui_settings(comfyui: ComfyUISim, tmp_path: Path) -> Callable[..., Settings]:
    def make(**overrides: Any) -> Settings:
        values: dict[str, Any] = {
            "COMFYUI_URL": comfyui.url,
            "COMFYUI_HISTORY_POLL_S": POLL_S,
            "SPILLWAY_OUTPUT_DIR": tmp_path / "outputs",
        }
        return Settings(**(values | overrides))

    return make


@pytest.fixture
def comfyui_activities(
    http: httpx.AsyncClient, comfyui_settings: Callable[..., Settings]
) -> Callable[..., ComfyUIActivities]:
    def make(**overrides: Any) -> ComfyUIActivities:
        return ComfyUIActivities(http, comfyui_settings(**overrides), heartbeat_every_s=0.05)

    return make


@pytest.fixture
def run_comfyui_activity() -> Callable[..., Awaitable[tuple[Any, list[Any]]]]:
    async def run(fn: Callable[..., Awaitable[Any]], arg: Any) -> tuple[Any, list[Any]]:
        heartbeats: list[Any] = []
        environment = ActivityEnvironment()
        environment.on_heartbeat = lambda *details: heartbeats.append(
            details[0] if details else None
        )
        try:
            result: Any = await environment.run(fn, arg)
        except Exception as exc:
            result = exc
        return result, heartbeats

    return run
