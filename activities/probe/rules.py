"""Turning raw readings into a LoadStatus: the OR of the three sources and the reason codes.

Pure (no I/O) so the rules (docs/design.md, "The load probe") are tested without servers. A
reading that is `None` was not measured and never makes the GPU overloaded: fail-open.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from spillway.core.hosts import UNREACHABLE
from spillway.core.models import LoadStatus, Thresholds


@dataclass(frozen=True)
class Readings:
    comfyui_answered: bool
    vram_pct: float | None = None
    gpu_util_pct: float | None = None
    queue_pending: int | None = None
    queue_running: int | None = None
    guard_busy: bool | None = None
    guard_job: str | None = None
    errors: list[str] = field(default_factory=list)


def vram_pct(vram_total: int, vram_free: int) -> float:
    # Rounded before comparing, so the shown figure and the verdict never disagree (84.96 -> 85.0).
    return round((vram_total - vram_free) / vram_total * 100, 1)


def assess(readings: Readings, thresholds: Thresholds, measured_at: datetime) -> LoadStatus:
    reasons: list[str] = []
    if not readings.comfyui_answered:
        reasons.append(UNREACHABLE)

    vram = readings.vram_pct
    if vram is not None and vram >= thresholds.vram_busy_pct:
        reasons.append(f"vram_used_{vram:.1f}pct_ge_{thresholds.vram_busy_pct:.1f}pct")

    util, pending = readings.gpu_util_pct, readings.queue_pending
    if (
        util is not None
        and pending is not None
        and util >= thresholds.util_busy_pct
        and pending >= 1
    ):
        reasons.append(
            f"gpu_util_{round(util)}pct_ge_{round(thresholds.util_busy_pct)}pct"
            f"_queue_pending_{pending}"
        )

    if readings.guard_busy is True:
        reasons.append(f"a40_guard_busy_job={readings.guard_job or 'unknown'}")

    return LoadStatus(
        reachable=readings.comfyui_answered,
        overloaded=any(r != UNREACHABLE for r in reasons),
        vram_pct=vram,
        gpu_util_pct=util,
        queue_pending=pending,
        queue_running=readings.queue_running,
        guard_busy=readings.guard_busy,
        guard_job=readings.guard_job,
        reasons=reasons,
        errors=list(readings.errors),
        measured_at=measured_at,
        thresholds=thresholds,
    )
