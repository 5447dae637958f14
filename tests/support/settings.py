"""Settings for tests: one factory, `make_settings(*layers, **overrides)`, and named layers of
values. Later layers win, the test's own keyword arguments (env names) last.

- QUIET, always first: nothing armed, no key, no webhook, no guard, whatever this process's
  environment holds. `KEY`: a MiniMax key, the fallback not armed. `ARMED`: key and fallback.
- `comfyui_values(sim, outputs)`: pointed at the ComfyUI double, with a short history poll and
  probe timeout; `minimax_values(sim, outputs)`: at the MiniMax double with the canary key and
  short intervals. Both write outputs to a folder of the test's own.
- `settings_on(values)`: a factory of settings on those values, `(**overrides) -> Settings`.
- `two_host_tiers(tmp_path, first, second)`: a routing_tiers.json with two GPU hosts.
- Fixtures: `comfyui_settings(**overrides)` and `minimax_settings(**overrides)`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import pytest

from spillway.core.settings import PROJECT_ROOT, Settings
from spillway.sim.comfyui import ComfyUISim
from spillway.sim.minimax import MiniMaxSim
from tests.support.constants import CANARY_KEY, LEDGER_SECRET, TEST_KEY

SettingsFactory = Callable[..., Settings]

QUIET: dict[str, Any] = {
    "CLOUD_VIDEO_FALLBACK_ENABLED": False,
    "MINIMAX_API_KEY": None,
    "APPROVAL_WEBHOOK_URL": None,
    "A40_GUARD_URL": None,
    "SPILLWAY_APPROVAL_SECRET": None,
}
KEY: dict[str, Any] = {"MINIMAX_API_KEY": TEST_KEY}
KEY_NAMES = ("MINIMAX_API_KEY", "KLING_ACCESS_KEY")
ARMED: dict[str, Any] = KEY | {"CLOUD_VIDEO_FALLBACK_ENABLED": True}
# Armed for Kling only, with a short heartbeat timeout: the time-skipping server skips no time
# while an activity runs, and a lost create is noticed by its missing heartbeat.
KLING_ARMED: dict[str, Any] = ARMED | {
    "CLOUD_PROVIDERS": "kling",
    "KLING_ACCESS_KEY": "kling-test-access",
    "KLING_SECRET_KEY": "kling-test-secret",
    "SPILLWAY_HEARTBEAT_TIMEOUT_S": 2,
}

# Production polls and waits for seconds; the same logic runs here in milliseconds.
COMFYUI_POLL_S = 0.1


def make_settings(*layers: Mapping[str, Any], **overrides: Any) -> Settings:
    """A cloud key brings the ledger's secret, as shipped (a worker holding a key does not start
    without one, and only a worker with it vets the spend ledger), unless the test names it."""
    values = dict(QUIET)
    for layer in layers:
        values |= layer
    values |= overrides
    if any(values.get(key) for key in KEY_NAMES):
        values.setdefault("SPILLWAY_LEDGER_SECRET", LEDGER_SECRET)
    return Settings(**values)


def comfyui_values(comfyui: ComfyUISim, outputs: Path) -> dict[str, Any]:
    return {
        "COMFYUI_URL": comfyui.url,
        "COMFYUI_HISTORY_POLL_S": COMFYUI_POLL_S,
        "LOAD_PROBE_TIMEOUT_S": 2.0,  # the default: a busy machine's doubles took over a second
        "SPILLWAY_OUTPUT_DIR": outputs,
    }


def minimax_values(minimax: MiniMaxSim, outputs: Path) -> dict[str, Any]:
    return {
        "MINIMAX_API_KEY": CANARY_KEY,
        "MINIMAX_BASE_URL": minimax.url,
        "MINIMAX_POLL_INTERVAL_S": 0.05,
        "MINIMAX_CREATE_TIMEOUT_S": 0.5,
        "SPILLWAY_OUTPUT_DIR": outputs,
    }


def settings_on(values: Mapping[str, Any]) -> SettingsFactory:
    def make(**overrides: Any) -> Settings:
        return make_settings(values, **overrides)

    return make


@pytest.fixture
def comfyui_settings(comfyui: ComfyUISim, tmp_path: Path) -> SettingsFactory:
    return settings_on(comfyui_values(comfyui, tmp_path / "outputs"))


@pytest.fixture
def minimax_settings(minimax: MiniMaxSim, tmp_path: Path) -> SettingsFactory:
    return settings_on(minimax_values(minimax, tmp_path / "outputs"))


def two_host_tiers(tmp_path: Path, first: dict[str, Any], second: dict[str, Any]) -> Path:
    """The project's routing_tiers.json with its GPU host (`first` on top) and a second one,
    `gpu-b` of tier 2 (`second` on top), written under `tmp_path`."""
    tiers = json.loads((PROJECT_ROOT / "routing_tiers.json").read_text())
    host = tiers["video_tiers"][0]
    tiers["video_tiers"][:1] = [host | first, host | {"tier": 2, "name": "gpu-b"} | second]
    path = tmp_path / "tiers.json"
    path.write_text(json.dumps(tiers))
    return path
