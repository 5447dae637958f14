"""The routing decision (docs/design.md, "The decision") as a pure function: no I/O, no clock, no
randomness, so the workflow can call it and replay it. `TABLE` is the one written form of the
decision: `spillway health` prints it, a test checks that the README shows the same rows, and
the table-driven test pins `decide` to it row by row.

"Armed" is `is_armed` and nothing else. The budget is the one part of "armed" that is not
known here: the spend ledger checks it when the cost is reserved, and an armed job it cannot
cover waits for a person (`budget_exhausted`), like an unarmed one.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from pydantic import BaseModel

from spillway.core.models import LoadStatus, VideoJob

Route = Literal["local", "cloud", "await"]
QuoteRoute = Literal["local", "cloud", "await_approval"]


@dataclass(frozen=True)
class Row:
    reachable: bool
    overloaded: bool | None  # None: any (not measured when ComfyUI is unreachable)
    armed: bool | None  # None: any
    route: Route
    says: str  # the route column as people read it


TABLE = (
    Row(True, False, None, "local", "LOCAL: submit to ComfyUI"),
    Row(True, True, True, "cloud", "CLOUD: MiniMax (tier 5)"),
    Row(True, True, False, "await", "AWAIT approval"),
    Row(False, None, True, "cloud", "CLOUD"),
    Row(False, None, False, "await", "AWAIT approval; without one, wait for ComfyUI to come back"),
)


def is_armed(fallback_enabled: bool, key_present: bool, has_cloud_request: bool) -> bool:
    """CLOUD_VIDEO_FALLBACK_ENABLED=1 AND a provider key on the worker AND a cloud request in the
    job (the budget is the ledger's to check)."""
    return fallback_enabled and key_present and has_cloud_request


def quote_route(route: Route, patient: bool, has_cloud: bool) -> QuoteRoute:
    """The route a quote names for a decision: a job waiting by its patience waits in line; one
    that may not spend waits in line for a place, or with a cloud prompt also for a person."""
    if patient or route == "local" or (route == "await" and not has_cloud):
        return "local"
    return "cloud" if route == "cloud" else "await_approval"


def table_rows() -> list[tuple[str, str, str, str]]:
    """The table as the README and `spillway health` write it: yes / no / a dash / any."""

    def cell(value: bool | None, unset: str) -> str:
        return unset if value is None else ("yes" if value else "no")

    return [
        (cell(r.reachable, "any"), cell(r.overloaded, "\N{EN DASH}"), cell(r.armed, "any"), r.says)
        for r in TABLE
    ]


class Decision(BaseModel):
    route: Route
    trigger: Literal["overloaded", "unreachable"] | None
    reasons: list[str]
    why: str


def patience_s(job: VideoJob, overflow_after_s: float, now: datetime) -> float | None:
    """How long an armed job may wait in the GPU line before the cloud: its own `max_wait_s`, the
    time to its `deadline`, else the workers' CLOUD_OVERFLOW_AFTER_S; None (or 0): overflow as
    soon as the places are full."""
    if job.max_wait_s is not None:
        return job.max_wait_s or None
    if job.deadline is not None:
        return max((job.deadline - now).total_seconds(), 0.0)
    return overflow_after_s or None


def places_taken(load: LoadStatus, full: list[str]) -> LoadStatus:
    """The reading as the decision sees it once the GPU pool said every place that the job could
    take is taken (docs/design.md, "GPU admission"): overloaded, the pool's reasons added
    (`gpu_places_full_<host>_<n>of<max>`)."""
    if not load.reachable or load.overloaded:
        return load
    return load.model_copy(update={"overloaded": True, "reasons": [*load.reasons, *full]})


def decide(load: LoadStatus, armed: bool) -> Decision:
    """`reachable=False` must already be confirmed by a second probe."""
    if load.reachable and not load.overloaded:
        return Decision(route="local", trigger=None, reasons=[], why="a GPU host has headroom")
    trigger: Literal["overloaded", "unreachable"] = (
        "overloaded" if load.reachable else "unreachable"
    )
    if armed:
        return Decision(
            route="cloud",
            trigger=trigger,
            reasons=load.reasons,
            why=f"the GPU hosts are {trigger} and the cloud fallback is armed",
        )
    return Decision(
        route="await",
        trigger=trigger,
        reasons=load.reasons,
        why=f"the GPU hosts are {trigger} and the cloud fallback is not armed: a person decides",
    )
