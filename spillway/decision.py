"""The routing decision of DESIGN.md as a pure function: no I/O, no clock, no randomness, so the
workflow can call it and replay it, and a table-driven test pins every row.

| ComfyUI reachable | overloaded | armed | route |
| yes | no  | any | LOCAL |
| yes | yes | yes | CLOUD |
| yes | yes | no  | AWAIT approval |
| no  | -   | yes | CLOUD |
| no  | -   | no  | AWAIT approval (else wait for ComfyUI) |

"Armed" means CLOUD_VIDEO_FALLBACK_ENABLED=1 AND a MiniMax key on the worker AND a cloud request
in the job; `reachable=False` must already be confirmed by a second probe.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

from spillway.models import LoadStatus


class Decision(BaseModel):
    route: Literal["local", "cloud", "await"]
    trigger: Literal["overloaded", "unreachable"] | None
    reasons: list[str]
    why: str


def decide(load: LoadStatus, armed: bool) -> Decision:
    if load.reachable and not load.overloaded:
        return Decision(route="local", trigger=None, reasons=[], why="the A40 has headroom")
    trigger: Literal["overloaded", "unreachable"] = (
        "overloaded" if load.reachable else "unreachable"
    )
    what = "overloaded" if load.reachable else "unreachable"
    if armed:
        return Decision(
            route="cloud",
            trigger=trigger,
            reasons=load.reasons,
            why=f"the A40 is {what} and the cloud fallback is armed",
        )
    return Decision(
        route="await",
        trigger=trigger,
        reasons=load.reasons,
        why=f"the A40 is {what} and the cloud fallback is not armed: a person decides",
    )
