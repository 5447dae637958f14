"""The Kling double and activities; loaded by conftest.

- `kling`: the Kling double on loopback, expecting the distinctive keys `CANARY_ACCESS` and
  `CANARY_SECRET` (finding either, or a JWT, anywhere but in the double is a leak); its videos
  are `VIDEO_SIZE` bytes.
- `kling_values(sim, outputs)`, `kling_settings(**overrides)`: settings pointed at the double
  with the canary keys and a short poll interval.
- `kling_activities(timing=FAST, ledger=None, **overrides)`: KlingActivities on
  `kling_settings`, with `FAST` timing and a `KlingBookLedger` (BookLedger, the real
  book-keeping in process, reserving a job for Kling on its first create).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from activities.kling.activities import KlingActivities
from activities.kling.client import KlingTiming
from spillway.sim.kling import KlingSim
from tests.support.minimax import FAST_WAITS, BookLedger, cloud_activities
from tests.support.settings import SettingsFactory, settings_on

CANARY_ACCESS = "kling-CANARY-access-51c0e2"
CANARY_SECRET = "kling-CANARY-secret-3b9f1e7d-do-not-log"
VIDEO_SIZE = 300_000  # a few chunks, so the download streams and reports progress
# routing_tiers.json: Kling std/5s, what a default request is reserved at in these tests.
KLING_CLIP_USD = 0.21

# Production waits are seconds to minutes; the same logic runs here in milliseconds.
FAST = KlingTiming(**FAST_WAITS, create_timeout_s=0.5, unknown_task_polls=3)


@pytest.fixture
async def kling() -> AsyncIterator[KlingSim]:
    async with KlingSim(
        access_key=CANARY_ACCESS, secret_key=CANARY_SECRET, video_size=VIDEO_SIZE
    ) as sim:
        yield sim


def kling_values(kling: KlingSim, outputs: Path) -> dict[str, Any]:
    return {
        "KLING_ACCESS_KEY": CANARY_ACCESS,
        "KLING_SECRET_KEY": CANARY_SECRET,
        "KLING_BASE_URL": kling.url,
        "KLING_POLL_INTERVAL_S": 0.05,
        "SPILLWAY_OUTPUT_DIR": outputs,
    }


@pytest.fixture
def kling_settings(kling: KlingSim, tmp_path: Path) -> SettingsFactory:
    return settings_on(kling_values(kling, tmp_path / "outputs"))


@pytest.fixture
def kling_activities(
    http: httpx.AsyncClient, kling_settings: SettingsFactory
) -> Callable[..., KlingActivities]:
    return cloud_activities(KlingActivities, http, kling_settings, FAST, KlingBookLedger)


class KlingBookLedger(BookLedger):
    """BookLedger whose first `begin` for a job reserves it for Kling, at Kling's price."""

    def __init__(self) -> None:
        super().__init__(provider="kling", cost_usd=KLING_CLIP_USD)
