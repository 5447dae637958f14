"""The MiniMax double's tasks: what a task holds, which create bodies MiniMax would refuse, how
a task is numbered when made, and the answer a query gives as it moves the task one step along
its status sequence (docs/design.md, "MiniMax facts"). The server is in `spillway.sim.minimax`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from activities.minimax.answers import STATUS_MSGS
from spillway.models import MINIMAX_MODELS

DEFAULT_STATUSES: tuple[str, ...] = ("Preparing", "Queueing", "Processing", "Success")
VIDEO_SIZES = {"512P": (910, 512), "720P": (1280, 720), "768P": (1366, 768), "1080P": (1920, 1080)}
TASK_BASE, FILE_BASE = 106_916_112_212_032, 205_258_526_306_433


@dataclass
class SimTask:
    task_id: str
    file_id: int
    prompt: str
    body: dict[str, Any]
    statuses: tuple[str, ...]
    fail_code: int = 0
    fail_msg: str = ""
    queries: int = 0


@dataclass(frozen=True)
class Script:
    """How tasks made from now on go: their statuses, and a Fail's base_resp."""

    statuses: tuple[str, ...]
    fail_code: int = 0
    fail_msg: str = ""


def new_task(n: int, body: dict[str, Any], prompt: str, script: Script) -> SimTask:
    """The `n`th task (from 1), following `script`."""
    return SimTask(
        task_id=str(TASK_BASE + n),
        file_id=FILE_BASE + n,
        prompt=prompt,
        body=body,
        statuses=script.statuses,
        fail_code=script.fail_code,
        fail_msg=script.fail_msg,
    )


def query_answer(task: SimTask) -> dict[str, Any]:
    """A query's answer for `task`, which moves it one step along its statuses."""
    status = task.statuses[min(task.queries, len(task.statuses) - 1)]
    task.queries += 1
    answer: dict[str, Any] = {"task_id": task.task_id, "status": status, "base_resp": ok()}
    if status == "Success":
        width, height = VIDEO_SIZES.get(str(task.body.get("resolution")), (1366, 768))
        answer |= {"file_id": str(task.file_id), "video_width": width, "video_height": height}
    elif status == "Fail":
        answer["base_resp"] = {"status_code": task.fail_code, "status_msg": task.fail_msg}
    return answer


def ok() -> dict[str, Any]:
    return {"status_code": 0, "status_msg": STATUS_MSGS[0]}


def invalid(body: Any) -> str | None:
    """Why MiniMax would refuse these parameters (code 2013), or None."""
    if not isinstance(body, dict):
        return "the body is not a JSON object"
    prompt, image = body.get("prompt"), body.get("first_frame_image")
    if not (isinstance(prompt, str) and prompt.strip()) and not isinstance(image, str):
        return "prompt is required"
    resolutions = MINIMAX_MODELS.get(str(body.get("model")))
    if resolutions is None:
        return f"unknown model {body.get('model')!r}"
    durations = resolutions.get(str(body.get("resolution", "768P")))
    if durations is None or body.get("duration", 6) not in durations:
        return "resolution and duration are not supported by this model"
    if not isinstance(body.get("prompt_optimizer", True), bool):
        return "prompt_optimizer must be a boolean"
    return None
