"""Models that cross a boundary: activity inputs and results, CLI JSON output.

Everything here travels through Temporal's history with the pydantic data converter, so it must
never hold a secret.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict


class Thresholds(BaseModel):
    model_config = ConfigDict(frozen=True)

    vram_busy_pct: float
    util_busy_pct: float


class LoadProbeRequest(BaseModel):
    """Input of `a40_load_status`; the job id only labels the measurement in logs."""

    job_id: str | None = None


class LoadStatus(BaseModel):
    """One measurement of the A40's load (DESIGN.md, "The load probe").

    `None` in a reading means "not measured" (source skipped or failed; see `errors`).
    `overloaded` is the OR of the three sources, and a failed source never contributes to it.
    """

    reachable: bool
    overloaded: bool
    vram_pct: float | None = None
    gpu_util_pct: float | None = None
    queue_pending: int | None = None
    queue_running: int | None = None
    guard_busy: bool | None = None
    guard_job: str | None = None
    reasons: list[str] = []
    errors: list[str] = []
    measured_at: datetime
    thresholds: Thresholds
