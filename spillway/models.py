"""Models that cross a boundary: activity inputs and results, CLI JSON output.

Everything here travels through Temporal's history with the pydantic data converter, so it must
never hold a secret.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, model_validator


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


# --- what a job is -------------------------------------------------------------------------

JobId = Annotated[
    str,
    Field(
        pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,99}$",
        description="letters, digits, '.', '_', '-'; it names a folder and a workflow id",
    ),
]

# MiniMax's accepted combinations (model -> resolution -> durations in seconds).
MINIMAX_MODELS: dict[str, dict[str, frozenset[int]]] = {
    "MiniMax-Hailuo-2.3": {"768P": frozenset({6, 10}), "1080P": frozenset({6})},
    "MiniMax-Hailuo-02": {
        "512P": frozenset({6, 10}),
        "768P": frozenset({6, 10}),
        "1080P": frozenset({6}),
    },
    "T2V-01-Director": {"720P": frozenset({6})},
    "T2V-01": {"720P": frozenset({6})},
}


class CloudRequest(BaseModel):
    """What MiniMax renders if the job goes to the cloud."""

    model_config = ConfigDict(frozen=True)

    prompt: Annotated[str, Field(min_length=1, max_length=2000)]
    model: str = "MiniMax-Hailuo-2.3"
    duration: int = 6
    resolution: str = "768P"
    prompt_optimizer: bool = True
    first_frame_image: str | None = None  # a public URL or a data: URL

    @model_validator(mode="after")
    def _minimax_accepts_it(self) -> CloudRequest:
        resolutions = MINIMAX_MODELS.get(self.model)
        if resolutions is None:
            raise ValueError(f"unknown MiniMax model {self.model!r}; one of {list(MINIMAX_MODELS)}")
        durations = resolutions.get(self.resolution)
        if durations is None:
            raise ValueError(
                f"{self.model} does not render {self.resolution}; one of {list(resolutions)}"
            )
        if self.duration not in durations:
            raise ValueError(
                f"{self.model} at {self.resolution} renders {sorted(durations)} s, "
                f"not {self.duration} s"
            )
        return self


class Progress(BaseModel):
    """Heartbeat details of long activities (ComfyUI wait, MiniMax poll, downloads)."""

    phase: str  # "queued", "running", "Processing", "downloading", ...
    node: str | None = None
    value: int | None = None
    max: int | None = None
    percent: float | None = None


class OutputFile(BaseModel):
    path: str
    bytes: int
    sha256: str


class Downloaded(BaseModel):
    outputs: list[OutputFile]
