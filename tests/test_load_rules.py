"""The pure rules that turn readings into a verdict and reason codes (spillway.load)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from activities.probe.rules import Readings, assess, vram_pct
from spillway.core.models import Thresholds
from tests.support.constants import FREE_VRAM_PCT

SEED = Thresholds(vram_busy_pct=85, util_busy_pct=95)
NOW = datetime(2026, 7, 24, 11, 34, 45, tzinfo=UTC)


@pytest.mark.parametrize(
    ("readings", "overloaded", "reasons"),
    [
        (Readings(True, vram_pct=FREE_VRAM_PCT), False, []),
        (Readings(True, vram_pct=85.0), True, ["vram_used_85.0pct_ge_85.0pct"]),
        (Readings(True, vram_pct=84.9), False, []),
        (Readings(True, gpu_util_pct=99, queue_pending=0), False, []),
        (
            Readings(True, gpu_util_pct=97.4, queue_pending=2),
            True,
            ["gpu_util_97pct_ge_95pct_queue_pending_2"],
        ),
        (Readings(True, gpu_util_pct=None, queue_pending=5), False, []),
        (Readings(True, gpu_util_pct=99, queue_pending=None), False, []),
        (Readings(True, guard_busy=True, guard_job="j1"), True, ["a40_guard_busy_job=j1"]),
        (Readings(True, guard_busy=True), True, ["a40_guard_busy_job=unknown"]),
        (Readings(True, guard_busy=False, guard_job="j1"), False, []),
        (Readings(True, guard_busy=None), False, []),
        # Unreachable is a trigger of its own, not "overloaded".
        (Readings(False), False, ["comfyui_unreachable"]),
        (
            Readings(False, guard_busy=True, guard_job="j2"),
            True,
            ["comfyui_unreachable", "a40_guard_busy_job=j2"],
        ),
    ],
)
def test_readings_give_verdict_and_reason_codes(readings, overloaded, reasons):
    status = assess(readings, SEED, NOW)
    assert status.overloaded == overloaded
    assert status.reasons == reasons
    assert status.reachable == readings.comfyui_answered
    assert status.measured_at == NOW and status.thresholds == SEED


def test_seed_vram_reading_is_42_4_percent():
    # "VRAM 25.9/45GB frei = 42.4% belegt"
    assert vram_pct(vram_total=45_000, vram_free=25_900) == FREE_VRAM_PCT == 42.4


def test_shown_vram_figure_and_verdict_agree_at_the_threshold():
    shown = vram_pct(vram_total=10_000, vram_free=1_504)  # 84.96 -> 85.0
    status = assess(Readings(True, vram_pct=shown), SEED, NOW)
    assert status.vram_pct == 85.0 and status.overloaded


def test_threshold_of_one_percent_formats_like_the_seed():
    status = assess(
        Readings(True, vram_pct=FREE_VRAM_PCT), Thresholds(vram_busy_pct=1, util_busy_pct=95), NOW
    )
    assert status.reasons == ["vram_used_42.4pct_ge_1.0pct"]
