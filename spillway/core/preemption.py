"""Who may take whose place (docs/design.md, "Preemption"; SPILLWAY_PREEMPT): pure, so the GPU
pool's book decides it in one place and a table test pins every rule.

`priority`: a waiting job may preempt a running one at least two priority steps lower (1 is
first). `fair`: that, and a job of a team below its share may preempt a job of a team above its
share. Never a job that has rendered longer than `max_run_s` (most of its work would be lost),
never a job preempted before, and one victim per waiting job: the lowest priority, then the
latest admitted.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

PreemptMode = Literal["off", "priority", "fair"]
STEPS = 2  # how many priority steps lower a victim must be


@dataclass(frozen=True)
class Waiting:
    job_id: str
    priority: int
    team: str


@dataclass(frozen=True)
class Running:
    job_id: str
    priority: int
    team: str
    since: datetime  # admitted to its place
    rendered_s: float  # how long its prompt has rendered (0 while it waits in ComfyUI's queue)
    preempted_before: bool = False


@dataclass(frozen=True)
class Shares:
    """Which teams hold fewer places than their share of those wanted, and which more (by the
    fair-share rule; teams at their share are in neither)."""

    below: frozenset[str] = frozenset()
    above: frozenset[str] = frozenset()


def may_preempt(mode: PreemptMode, waiting: Waiting, running: Running, shares: Shares) -> bool:
    """The rule alone, bounds aside."""
    if mode == "off":
        return False
    if running.priority - waiting.priority >= STEPS:
        return True
    return (
        mode == "fair"
        and waiting.team != running.team
        and waiting.team in shares.below
        and running.team in shares.above
    )


def victim(
    mode: PreemptMode,
    waiting: Waiting,
    running: Iterable[Running],
    *,
    max_run_s: float,
    shares: Shares = Shares(),
) -> Running | None:
    """The one running job `waiting` takes the place of, or None."""
    candidates = [
        r
        for r in running
        if not r.preempted_before
        and r.rendered_s <= max_run_s
        and r.job_id != waiting.job_id
        and may_preempt(mode, waiting, r, shares)
    ]
    if not candidates:
        return None
    return max(candidates, key=lambda r: (r.priority, r.since, r.job_id))
